package module

import (
	"bytes"
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
)

func TestTenantsAreKeptApartByDefault(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "")
	alice, bob := []string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}
	a := g.post(chatPath, "shared", chat("alice's prompt"), alice...)
	_, op := g.submit(t, "op-key", alice...)
	g.await(t, op.OperationID, alice...)

	b := g.post(chatPath, "shared", chat("alice's prompt"), bob...)
	if b.StatusCode != 200 || b.Header.Get(headerReplayed) != "" || bytes.Equal(a.body, b.body) {
		t.Fatalf("bob got alice's replay: %v replayed=%q", b.Status, b.Header.Get(headerReplayed))
	}
	for _, r := range []result{
		g.get("/v1/operations/"+op.OperationID, bob...),
		g.get("/v1/operations/"+op.OperationID+"/result", bob...),
		g.post("/v1/operations/"+op.OperationID+"/cancel", "", "", bob...),
	} {
		expectError(t, r, 404, apierr.CodeOperationNotFound, false)
	}
	for name, who := range map[string][]string{"bob": bob, "an anonymous caller": nil} {
		list := g.get("/v1/operations", who...)
		if list.StatusCode != 200 || bytes.Contains(list.body, []byte(op.OperationID)) {
			t.Fatalf("%s listed alice's operation: %v %s", name, list.Status, list.body)
		}
	}
	_, anon := g.submit(t, "anon-key")
	if list := g.get("/v1/operations"); bytes.Contains(list.body, []byte(anon.OperationID)) {
		t.Fatalf("callers without credentials list each other's operations: %s", list.body)
	}
	if list := g.get("/v1/operations", alice...); !bytes.Contains(list.body, []byte(op.OperationID)) {
		t.Fatalf("alice does not see her own operation: %s", list.body)
	}
}

func TestSharedScopeIsAnExplicitChoice(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "scope shared")
	a := g.post(chatPath, "k", chat("x"), "Authorization", "Bearer alice")
	b := g.post(chatPath, "k", chat("x"), "Authorization", "Bearer bob")
	if b.Header.Get(headerReplayed) != "true" || !bytes.Equal(a.body, b.body) {
		t.Fatalf("scope shared did not share: replayed=%q", b.Header.Get(headerReplayed))
	}
}

package module

import (
	"encoding/json"
	"net/url"
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
)

// listed reads a list answer's operation ids and cursor.
func listed(t *testing.T, r result) ([]string, string) {
	t.Helper()
	var page struct {
		Operations []opBody `json:"operations"`
		NextAfter  string   `json:"next_after"`
	}
	if r.err != nil || r.StatusCode != 200 || json.Unmarshal(r.body, &page) != nil || page.Operations == nil {
		t.Fatalf("not a list: %v %s", r.err, r.body)
	}
	var ids []string
	for _, op := range page.Operations {
		ids = append(ids, op.OperationID)
	}
	return ids, page.NextAfter
}

func TestLookupByKeyFindsOnlyTheCallersOperation(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "scope {http.request.header.Authorization}")
	alice, bob := []string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}
	_, mine := g.submit(t, "job-42", alice...)
	g.submit(t, "job-43", alice...)
	_, theirs := g.submit(t, "job-42", bob...)
	lookup := func(key string, who []string) result {
		return g.get("/v1/operations?idempotency_key="+url.QueryEscape(key), who...)
	}
	for _, tc := range []struct {
		name string
		key  string
		who  []string
		want []string
	}{
		{"the caller's own key", "job-42", alice, []string{mine.OperationID}},
		{"the same key in another scope", "job-42", bob, []string{theirs.OperationID}},
		{"a caller who never used it", "job-42", []string{"Authorization", "Bearer carol"}, nil},
		{"a key never used", "job-44", alice, nil},
		{"the quoted form of a key", `"job-42"`, alice, []string{mine.OperationID}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids, next := listed(t, lookup(tc.key, tc.who))
			if len(ids) != len(tc.want) || (len(ids) == 1 && ids[0] != tc.want[0]) || next != "" {
				t.Fatalf("found %v (next %q), want %v", ids, next, tc.want)
			}
		})
	}
	r := lookup("", alice)
	expectError(t, r, 400, apierr.CodeInvalidRequest, false)
	var e apierr.Body
	_ = json.Unmarshal(r.body, &e)
	if e.Error.Message != "the idempotency key is empty; send 1 to 255 printable ASCII characters in idempotency_key." {
		t.Fatalf("message %q", e.Error.Message)
	}
}

func TestLookupByKeyPagesLikeTheList(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	var ids []string
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"} {
		r := g.post(path, "shared", `{"model":"demo","prompt":"x","input":"x"}`, "Prefer", "respond-async", "Authorization", "Bearer paging")
		if r.StatusCode != 202 {
			t.Fatalf("%s: %d %s", path, r.StatusCode, r.body)
		}
		ids = append(ids, decodeOp(t, r).OperationID)
	}
	first, next := listed(t, g.get("/v1/operations?idempotency_key=shared&limit=2", "Authorization", "Bearer paging"))
	if len(first) != 2 || first[0] != ids[2] || first[1] != ids[1] || next != ids[1] {
		t.Fatalf("first page %v next %q, want %v newest first", first, next, ids)
	}
	rest, next := listed(t, g.get("/v1/operations?idempotency_key=shared&limit=2&after="+next, "Authorization", "Bearer paging"))
	if len(rest) != 1 || rest[0] != ids[0] || next != "" {
		t.Fatalf("second page %v next %q", rest, next)
	}
}

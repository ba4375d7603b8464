package module

import (
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
)

func TestScopeOverMaxPerScopeIsRateLimited(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 20 * time.Second}, "async {\n max_per_scope 2\n concurrency 1\n}")
	alice, bob := []string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}
	_, first := g.submit(t, "a1", alice...)
	g.submit(t, "a2", alice...)
	r := g.post(chatPath, "a3", chat("async a3"), append([]string{"Prefer", "respond-async"}, alice...)...)
	expectError(t, r, 429, apierr.CodeRateLimited, true)
	if r.Header.Get("Retry-After") == "" || !strings.Contains(string(r.body), "2 operations queued or running") {
		t.Fatalf("429 without Retry-After or its reason: %v %s", r.Header, r.body)
	}
	g.submit(t, "b1", bob...) // another scope is not affected
	if again, op := g.submit(t, "a1", alice...); op.OperationID != first.OperationID || again.Header.Get(headerReplayed) != "true" {
		t.Fatalf("a keyed retry of an accepted request was not replayed: %s", again.body)
	}
	g.post(first.Links.Cancel, "", "", alice...)
	g.submit(t, "a3", alice...) // a final operation leaves the count
}

func TestMaxPerScopeCountsWhatTheStoreHolds(t *testing.T) {
	g := startGateway(t, modelserver.Config{Latency: 20 * time.Second}, "async {\n concurrency 1\n}")
	alice := []string{"Authorization", "Bearer alice"}
	g.submit(t, "a1", alice...)
	g.submit(t, "a2", alice...)
	// The limit arrives with a new config: its count starts from the operations in the store,
	// as after a restart.
	g.reload("async {\n max_per_scope 2\n concurrency 1\n}")
	r := g.post(chatPath, "a3", chat("async a3"), append([]string{"Prefer", "respond-async"}, alice...)...)
	expectError(t, r, 429, apierr.CodeRateLimited, true)
}

func TestReadinessProbesDoNotWriteToTheStore(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	fsyncs := func() float64 { return g.scrape(t)["mulligan_store_fsync_batch_size_count"] }
	if r := g.get(pathReady); r.StatusCode != 200 {
		t.Fatalf("ready: %d %s", r.StatusCode, r.body)
	}
	before := fsyncs()
	for range 20 {
		if r := g.get(pathReady); r.StatusCode != 200 {
			t.Fatalf("ready: %d %s", r.StatusCode, r.body)
		}
	}
	if n := fsyncs() - before; n > 1 {
		t.Fatalf("20 readiness probes made %v durable writes", n)
	}
}

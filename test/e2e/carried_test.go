package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// TestReplicasKeepWhatAnOperationCarries: an operation accepted by one replica of a PostgreSQL
// storage keeps its type, metadata and trace on the others: whichever replica runs it sends
// the submitting request's traceparent upstream, and the other replica finds it by its key.
func TestReplicasKeepWhatAnOperationCarries(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Database(t)
	model := modelserver.New(modelserver.Config{})
	var mu sync.Mutex
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("traceparent"))
		mu.Unlock()
		model.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	rs := startReplicas(t, 2, up.URL, dsn, "async {\n type chat_completion\n}")

	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp, body, err := rs[0].send("POST", "/v1/chat/completions", "job-7",
		`{"metadata":{"ticket":"T-1"},"messages":[{"role":"user","content":"hi"}]}`, "Prefer", "respond-async", "traceparent", traceparent, "Authorization", "Bearer carried")
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: %v %v %s", err, resp, body)
	}
	var op operation
	_ = json.Unmarshal(body, &op)
	rs[1].await(t, op.OperationID, 60*time.Second, "Authorization", "Bearer carried")

	resp, body, err = rs[1].send("GET", "/v1/operations?idempotency_key="+url.QueryEscape("job-7"), "", "", "Authorization", "Bearer carried")
	var page struct {
		Operations []struct {
			OperationID string          `json:"operation_id"`
			Type        string          `json:"type"`
			Metadata    json.RawMessage `json:"metadata"`
		} `json:"operations"`
	}
	if err != nil || resp.StatusCode != 200 || json.Unmarshal(body, &page) != nil || len(page.Operations) != 1 {
		t.Fatalf("lookup on the other replica: %v %v %s", err, resp, body)
	}
	if got := page.Operations[0]; got.OperationID != op.OperationID || got.Type != "chat_completion" || string(got.Metadata) != `{"ticket":"T-1"}` {
		t.Fatalf("found %+v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != traceparent {
		t.Fatalf("the upstream saw traceparent %q", seen)
	}
}

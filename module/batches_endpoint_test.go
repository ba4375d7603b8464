package module

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
)

// TestBatchEndpointMustBeAPlainPathUnderThePrefix: an endpoint outside the prefix, inside the
// API's own paths, or written in any but its canonical form is refused with OpenAI's 400.
func TestBatchEndpointMustBeAPlainPathUnderThePrefix(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, batchesBlock)
	var f struct{ ID string }
	if up := g.uploadFile(t, batchInput(1, func(int) string { return "x" }), "batch"); json.Unmarshal(up.body, &f) != nil {
		t.Fatalf("upload: %s", up.body)
	}
	for _, ep := range []string{"/admin", "/v1/chat/completions/../x", "//host/v1/files", "/v1//chat/completions",
		"/v1/chat/completions/", "/v1/chat%2fcompletions", "/v1/chat/completions?x=1", "/v1/files", "/v1/batches/b", "/v1"} {
		body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":%q,"completion_window":"24h"}`, f.ID, ep)
		expectOpenAIError(t, g.post("/v1/batches", "", body), http.StatusBadRequest, apierr.CodeInvalidRequest, "endpoint must be the path each line is sent to")
	}
	body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/embeddings","completion_window":"24h"}`, f.ID)
	if b := decodeBatch(t, g.post("/v1/batches", "", body)); b.Status != "validating" && b.Status != "in_progress" && b.Status != "failed" {
		t.Fatalf("a plain endpoint under /v1: %+v", b)
	}
}

// TestBatchLinesCarryOnlyTheCreatorsAllowedHeaders: a line is sent with the creator's
// credentials and OpenAI headers, never its cookies, forwarding or transfer headers.
func TestBatchLinesCarryOnlyTheCreatorsAllowedHeaders(t *testing.T) {
	t.Parallel()
	up := newBatchUpstream()
	g := startHandlerWith(t, gatewaySetup{wrap: up.wrap, mulligan: batchesBlock})
	b := g.createBatch(t, batchInput(1, func(int) string { return "headers" }), "24h", "Authorization", "Bearer alice",
		"OpenAI-Organization", "org-1", "Cookie", "session=secret", "X-Forwarded-For", "203.0.113.9", "X-Internal", "yes")
	if b = g.awaitBatch(t, b.ID, "Authorization", "Bearer alice"); b.Status != "completed" {
		t.Fatalf("batch %s %+v", b.Status, b.RequestCounts)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	h := up.seen
	if h.Get("Authorization") != "Bearer alice" || h.Get("Openai-Organization") != "org-1" || h.Get("Content-Type") != "application/json" {
		t.Fatalf("a line lost the creator's allowed headers: %v", h)
	}
	for _, name := range []string{"Cookie", "X-Internal"} {
		if h.Get(name) != "" {
			t.Fatalf("a line carried the creator's %s: %v", name, h)
		}
	}
	if strings.Contains(strings.Join(h.Values("X-Forwarded-For"), ","), "203.0.113.9") {
		t.Fatalf("a line carried the creator's X-Forwarded-For: %v", h)
	}
}

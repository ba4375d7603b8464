package module

import (
	"net/http"
	"slices"
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// TestFirstAnswerAndReplayCarryTheSameHeaders: a keyed call's first answer and its replay differ
// only in what marks a replay (docs/api.md), in every way the first answer can be written: relayed
// as it arrives, or buffered within an `after` window. (Caddy presets `Server: Caddy`, which
// reverse_proxy drops from a relayed answer: a replay kept it.)
func TestFirstAnswerAndReplayCarryTheSameHeaders(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"relayed", ""},
		{"within an after window", "async {\n mode after 5s\n }"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, modelserver.Config{}, tc.body)
			const body = `{"messages":[{"role":"user","content":"same headers"}]}`
			first := g.post("/v1/chat/completions", "k-headers", body)
			again := g.post("/v1/chat/completions", "k-headers", body)
			if first.err != nil || again.err != nil || first.StatusCode != 200 || again.Header.Get(headerReplayed) != "true" {
				t.Fatalf("first %v %v, again %v %v (replayed %q)", first.Response, first.err, again.Response, again.err, again.Header.Get(headerReplayed))
			}
			ignore := []string{"Date", "X-Request-Id", headerReplayed}
			for _, pair := range [][2]http.Header{{first.Header, again.Header}, {again.Header, first.Header}} {
				for name, v := range pair[0] {
					if !slices.Contains(ignore, name) && !slices.Equal(v, pair[1][name]) {
						t.Errorf("%s: first answer %q, replay %q", name, first.Header[name], again.Header[name])
					}
				}
			}
		})
	}
}

package module

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// A reload that fails to start (here: the new config's second site cannot bind its port) leaves
// the old config serving. Its operations must still run through the old config's server, not
// through the servers of the config that never started (Caddy starts apps in no fixed order, so
// mulligan's Start may have run before the HTTP app failed).
func TestFailedReloadKeepsOperationsOnTheRunningConfig(t *testing.T) {
	var onA, onB atomic.Int64
	answer := func(n *atomic.Int64, name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"upstream":%q}`, name)
		})
	}
	g := startGatewayBefore(t, answer(&onA, "A"), "log {\n level ERROR\n }", "")
	b := httptest.NewServer(answer(&onB, "B"))
	defer b.Close()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	// The failing config: the same site proxying to B, and a second site on a port in use.
	var cfg map[string]any
	raw := bytes.ReplaceAll(g.config(""), []byte(strings.TrimPrefix(g.upstream.URL, "http://")), []byte(strings.TrimPrefix(b.URL, "http://")))
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	servers := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)
	servers["busy"] = map[string]any{"listen": []string{busy.Addr().String()}}
	failing, _ := json.Marshal(cfg)

	const tries = 12
	for i := range tries {
		resp, err := http.Post("http://"+g.admin+"/load", "application/json", bytes.NewReader(failing))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("the reload onto a port in use succeeded: %s", msg)
		}
		_, op := g.submit(t, fmt.Sprintf("after-failed-reload-%d", i))
		if got := g.await(t, op.OperationID); got.Status != "succeeded" || !strings.Contains(string(got.Response.Body), `"A"`) {
			body := ""
			if got.Response != nil {
				body = string(got.Response.Body)
			}
			t.Fatalf("try %d: after a failed reload the operation ended %s (%s), want succeeded on the running config's upstream A", i, got.Status, body)
		}
	}
	if onB.Load() != 0 || onA.Load() != tries {
		t.Fatalf("upstream A ran %d, B (of the config that failed) %d; want %d and 0", onA.Load(), onB.Load(), tries)
	}
}

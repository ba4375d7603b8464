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

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
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
	g := startGatewayBefore(t, answer(&onA, "A"), quietGlobals, "")
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
		resp, err := g.adminPost("/load", failing)
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

// A reload that adds a site ahead of the one that accepted an operation renumbers Caddyfile
// servers (srv0, srv1, ... in order): a queued operation must still run through the site that
// accepted it, never through whichever server now bears its old name.
func TestQueuedOperationRunsOnItsSiteAfterAReloadRenumbersServers(t *testing.T) {
	release := make(chan struct{})
	var onA, onB atomic.Int64
	a := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if onA.Add(1) == 1 {
			<-release // holds the only slot, so the second operation stays queued
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"upstream":"A"}`)
	})
	g := startGatewayBefore(t, a, quietGlobals, "async {\n concurrency 1\n }")
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		onB.Add(1)
		fmt.Fprint(w, `{"upstream":"B"}`)
	}))
	defer b.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()

	_, first := g.submit(t, "holds-the-slot")
	testkit.WaitFor(t, 5*time.Second, "onA.Load() == 1", func() bool { return onA.Load() == 1 })
	_, queued := g.submit(t, "queued-across-the-reload")

	// The new config puts another site first: it becomes srv0, the accepting site srv1.
	other := testkit.FreePorts(t, 1)[0]
	cf := strings.Replace(string(g.caddyfile("async {\n concurrency 1\n }")), fmt.Sprintf("http://127.0.0.1:%d {", g.port),
		fmt.Sprintf("http://127.0.0.1:%d {\n\treverse_proxy %s\n}\nhttp://127.0.0.1:%d {", other, strings.TrimPrefix(b.URL, "http://"), g.port), 1)
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := g.adminPost("/load", out)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reload: %d %s", resp.StatusCode, msg)
	}
	close(release)
	for _, id := range []string{first.OperationID, queued.OperationID} {
		got := g.await(t, id)
		if got.Status != "succeeded" || got.Response == nil || !strings.Contains(string(got.Response.Body), `"A"`) {
			t.Errorf("%s ended %s %+v, want succeeded on its own site's upstream A", id, got.Status, got.Response)
		}
	}
	if onB.Load() != 0 {
		t.Fatalf("the other site's upstream B ran %d operations accepted by the first site", onB.Load())
	}
}

// A gateway stopping while its storage is down hands its running operations back within the
// grace period, then lets go: what it could not record is the takeover's, as after a crash. It
// must not hold the stop (a reload, a SIGTERM) for the two minutes a final transition is
// retried while the gateway runs on.
func TestStopWithStorageDownEndsWithinTheGracePeriod(t *testing.T) {
	started := make(chan struct{}, 1)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so the server sees the gateway hang up
		select {
		case started <- struct{}{}:
		default:
		}
		<-r.Context().Done()
	})
	g := startGatewayBefore(t, upstream, quietGlobals, "")
	g.submit(t, "running-at-stop")
	<-started
	g.closeStorages()
	stopped := make(chan error, 1)
	begun := time.Now()
	go func() { stopped <- caddy.Stop() }()
	select {
	case <-stopped:
		t.Logf("stopped %v after the storage went down (grace 500ms)", time.Since(begun).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("the gateway was still stopping 20s after its grace period began: a running operation's hand-back to a storage that is down held it")
	}
}

// TestReloadWhileAnOperationRunsNeitherRequeuesNorRepeatsIt reloads twice while a call runs:
// once keeping the storage's runner, once opening the storage anew (durability changed), so
// a second runner starts beside the first during its grace period.
func TestReloadWhileAnOperationRunsNeitherRequeuesNorRepeatsIt(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	_, op := g.submit(t, "long", "X-Mock-Latency", "2s")
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	g.reload("idempotency {\n ttl 48h\n}")
	g.reload("durability relaxed")
	final := g.await(t, op.OperationID)
	s := g.model.Stats()
	t.Logf("%s after %d attempt(s); the model server ran %d time(s)", final.Status, final.Attempts, s.Received)
	if final.Status != "succeeded" || final.Attempts != 1 || s.Received != 1 {
		t.Fatalf("%s, %d attempts, %d upstream runs: want succeeded once", final.Status, final.Attempts, s.Received)
	}
}

// Reloads in a row, each opening the storage anew or keeping it, leave one working gateway.
// Every load replaces Caddy's admin server too: a client that reuses a connection to the one
// being replaced has its next reload cut (failed in CI before the tests' admin calls stopped
// keeping connections alive, and here on the second reload).
func TestReloadsInARowLeaveOneWorkingGateway(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	for i := range 200 {
		if i%2 == 0 {
			g.reload("idempotency {\n ttl 48h\n}")
		} else {
			g.reload("durability relaxed")
		}
	}
	_, op := g.submit(t, "after-the-reloads")
	if got := g.await(t, op.OperationID); got.Status != "succeeded" || got.Attempts != 1 {
		t.Fatalf("%s after %d attempts, want succeeded once", got.Status, got.Attempts)
	}
}

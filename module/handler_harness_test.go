package module

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// startHandler serves the mulligan block body on loopback without Caddy: the handler is
// provisioned with an App of its own on a Badger directory of the test's, each request is
// prepared as Caddy's server prepares it, and what the handler passes on goes to a model
// server with cfg on loopback through a reverse proxy, in reverse_proxy's place. Nothing of it
// is process-wide (its App keeps its storage and seats in a registry of its own), so its tests run in parallel; operations run through the same handler. Tests
// of a whole config (reloads, sites, the admin API, metrics, operations dispatched by Caddy's
// servers) stay on startGateway.
func startHandler(t *testing.T, cfg modelserver.Config, mulliganBody string) *gateway {
	t.Helper()
	return startHandlerWith(t, gatewaySetup{model: cfg, mulligan: mulliganBody})
}

// startHandlerWith is startHandler for the gateway s describes: its model server or upstream,
// and what wraps it. Global options and site directives are Caddy's, so s has none.
func startHandlerWith(t *testing.T, s gatewaySetup) *gateway {
	t.Helper()
	if s.site != "" || (s.globals != "" && s.globals != quietGlobals) {
		t.Fatal("startHandlerWith: site directives and global options are Caddy's (startGatewayWith)")
	}
	mulliganBody := s.mulligan
	g := &gateway{t: t, dir: t.TempDir(), client: &http.Client{Timeout: 30 * time.Second}}
	g.serveUpstream(s)
	target, _ := url.Parse(g.upstream.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("mulligan {\n storage " + g.dir + "/badger\n" + mulliganBody + "\n}")); err != nil {
		t.Fatal(err)
	}
	g.reg = newRegistry()
	app := &App{mu: new(sync.Mutex), refs: map[string]*storageRef{}, log: zap.NewNop(), reg: g.reg}
	if err := h.provision(zap.NewNop(), nil, app); err != nil {
		t.Fatal(err)
	}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		proxy.ServeHTTP(w, r)
		return nil
	})
	// The server a request came through, as Caddy's sets it: operations note it, to run there.
	server := &caddyhttp.Server{Listen: []string{"tcp/127.0.0.1:0"}}
	serve := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, server)
		if err := h.ServeHTTP(w, r, next); err != nil {
			var he caddyhttp.HandlerError
			if errors.As(err, &he) {
				w.WriteHeader(he.StatusCode)
				return
			}
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	srv := httptest.NewServer(serve)
	g.base = srv.URL
	app.mu.Lock()
	err := app.startLocked(func(*store.Operation) http.Handler { return serve }, time.Second)
	app.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		_ = h.Cleanup()
		_ = app.Cleanup()
		g.upstream.Close()
		deadline := time.Now().Add(30 * time.Second)
		for badger.IsOpen(g.dir+"/badger") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	})
	return g
}

package module

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// gateway is real Caddy, in this process, with the mulligan handler in front of a real model
// server on loopback, storing in a real Badger directory.
type gateway struct {
	t        *testing.T
	base     string // http://127.0.0.1:port
	admin    string
	port     int
	dir      string
	model    *modelserver.Server
	upstream *httptest.Server
	client   *http.Client
	globals  string       // extra global options
	site     string       // extra site directives
	reloaded atomic.Int64 // unix nanoseconds of the last reload: requests read it while a test reloads
	reg      *registry    // where its storages and seats are kept: nil for Caddy's (caddyRegistry)
}

// registry is where the gateway's storages and seats are kept.
func (g *gateway) registry() *registry {
	if g.reg != nil {
		return g.reg
	}
	return caddyRegistry
}

// startGateway starts a model server with cfg and Caddy with the given mulligan block body.
func startGateway(t *testing.T, cfg modelserver.Config, mulliganBody string) *gateway {
	t.Helper()
	return startGatewayWithGlobals(t, cfg, quietGlobals, mulliganBody)
}

// startGatewayWithGlobals is startGateway with extra global options.
func startGatewayWithGlobals(t *testing.T, cfg modelserver.Config, globals, mulliganBody string) *gateway {
	t.Helper()
	return startGatewayWith(t, gatewaySetup{model: cfg, globals: globals, mulligan: mulliganBody})
}

// startGatewayBefore starts Caddy with the given mulligan block in front of upstream, a real
// HTTP server on loopback.
func startGatewayBefore(t *testing.T, upstream http.Handler, globals, mulliganBody string) *gateway {
	t.Helper()
	return startGatewayWith(t, gatewaySetup{upstream: upstream, globals: globals, mulligan: mulliganBody})
}

// gatewaySetup is what a test may choose about its gateway beyond the mulligan block.
type gatewaySetup struct {
	model    modelserver.Config
	upstream http.Handler                    // instead of the model server, when set
	globals  string                          // global options
	site     string                          // more directives of the site (such as tracing)
	mulligan string                          // the mulligan block's body
	wrap     func(http.Handler) http.Handler // around the model server, to see what reaches it
}

// startGatewayWith starts the gateway s describes.
func startGatewayWith(t *testing.T, s gatewaySetup) *gateway {
	t.Helper()
	mulliganBody := s.mulligan
	g := &gateway{t: t, dir: t.TempDir(), globals: s.globals, site: s.site}
	g.serveUpstream(s)
	ports := testkit.FreePorts(t, 2)
	g.port = ports[0]
	g.base = fmt.Sprintf("http://127.0.0.1:%d", g.port)
	g.admin = fmt.Sprintf("127.0.0.1:%d", ports[1])
	g.client = &http.Client{Timeout: 30 * time.Second}
	if err := caddy.Load(g.config(mulliganBody), true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	t.Cleanup(func() {
		_ = caddy.Stop()
		g.upstream.Close()
		// A request still running when Caddy stopped keeps the store open until it ends; the
		// directory must outlive it, or Badger retries its last flush forever.
		deadline := time.Now().Add(30 * time.Second)
		for badger.IsOpen(g.dir+"/badger") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	})
	return g
}

// serveUpstream serves s's upstream (its model server unless it names one, wrapped as it says)
// on loopback as g's.
func (g *gateway) serveUpstream(s gatewaySetup) {
	upstream := s.upstream
	if upstream == nil {
		g.model = modelserver.New(s.model)
		upstream = g.model
	}
	if s.wrap != nil {
		upstream = s.wrap(upstream)
	}
	g.upstream = httptest.NewServer(upstream)
}

// config adapts the test Caddyfile to JSON.
func (g *gateway) config(mulliganBody string) []byte {
	g.t.Helper()
	cf := g.caddyfile(mulliganBody)
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(cf, nil)
	if err != nil {
		g.t.Fatalf("adapting: %v\n%s", err, cf)
	}
	return out
}

// caddyfile is the test Caddyfile with the given mulligan block body.
func (g *gateway) caddyfile(mulliganBody string) []byte {
	return []byte(fmt.Sprintf(`{
	admin %s
	persist_config off
	auto_https off
	grace_period 500ms
	storage file_system %s/caddy
	%s
}
http://127.0.0.1:%d {
	%s
	mulligan {
		storage %s/badger
		%s
	}
	reverse_proxy %s
}
`, g.admin, g.dir, g.globals, g.port, g.site, g.dir, mulliganBody, strings.TrimPrefix(g.upstream.URL, "http://")))
}

// reload loads a new config through Caddy's admin API, as an operator would, and returns once
// the old config's server accepts no more connections.
func (g *gateway) reload(mulliganBody string) {
	g.t.Helper()
	g.load(g.config(mulliganBody))
}

// load replaces the running config with cfg (JSON) through the admin endpoint, and returns once
// every new connection is served by it (see below).
func (g *gateway) load(cfg []byte) {
	g.t.Helper()
	old := g.idleConn()
	defer old.Close()
	resp, err := g.adminPost("/load", cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		g.t.Fatalf("reload: %d %s", resp.StatusCode, b)
	}
	// Caddy answers the load once the old servers' shutdowns have begun, not once they stopped
	// accepting: a connection dialed at once could still be accepted, and served, by the old
	// config (seen in CI: an operation accepted without the reload's max_per_scope). A server
	// shutting down closes its listeners, then its idle connections: once the old server closed
	// the idle one it served, every new connection is the new config's.
	_ = old.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := old.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
		g.t.Fatal("the old config's server still holds its idle connection 10s after the reload")
	}
	// A kept-alive connection still leads to the old config's server, which is closing it: the
	// next request dials the new one.
	g.client.CloseIdleConnections()
	g.reloaded.Store(time.Now().UnixNano())
}

// adminClient calls Caddy's admin endpoint on a fresh connection each time: every config load
// replaces the admin server, and the old one closes the connections it holds.
var adminClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// adminPost posts a JSON body to the admin endpoint's path. A connection the admin server being
// replaced by the last load accepted is cut before its request is read (seen in CI: a second
// reload's POST got EOF, and here connection resets): the post is sent again on a new one. Only
// for what may be sent twice: the same config loads once.
func (g *gateway) adminPost(path string, body []byte) (*http.Response, error) {
	for try := 0; ; try++ {
		resp, err := adminClient.Post("http://"+g.admin+path, "application/json", bytes.NewReader(body))
		if err == nil || try == 10 || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			return resp, err
		}
		g.t.Logf("admin %s, sending again: %v", path, err)
		time.Sleep(20 * time.Millisecond)
	}
}

// idleConn is a connection to the gateway's server, left idle after one request: the server that
// accepted it closes it when it shuts down.
func (g *gateway) idleConn() net.Conn {
	g.t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.base, "http://"))
	if err != nil {
		g.t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", g.base+pathLive, nil)
	if err := req.Write(conn); err != nil {
		g.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		g.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return conn
}

// handoverWindow is how long after a reload a request may still meet the old config's closing
// listener (a SYN in its queue is reset, never served).
const handoverWindow = 5 * time.Second

// result is a finished response with its body read.
type result struct {
	*http.Response
	body []byte
	err  error
}

func (r result) errorCode() string {
	var e apierr.Body
	_ = json.Unmarshal(r.body, &e)
	return string(e.Error.Code)
}

// post sends a chat completion with the given key (none when empty) and extra headers.
func (g *gateway) post(path, key, body string, headers ...string) result {
	req, err := http.NewRequest("POST", g.base+path, strings.NewReader(body))
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return g.do(req)
}

// do sends req and reads the whole answer. A keyed or GET request that got no answer at all
// shortly after a reload may have met the old config's closing listener: it is sent again, a
// few times, as any client would (a keyed one under its key, so it runs once). An unkeyed
// POST is never sent twice: a test must see what happened to it.
func (g *gateway) do(req *http.Request) result {
	resp, err := g.client.Do(req)
	resend := req.Method == http.MethodGet || req.Header.Get("Idempotency-Key") != ""
	for try := 0; err != nil && resend && try < 20 && time.Since(time.Unix(0, g.reloaded.Load())) < handoverWindow; try++ {
		time.Sleep(50 * time.Millisecond)
		again := req.Clone(req.Context())
		if req.GetBody != nil {
			body, berr := req.GetBody()
			if berr != nil {
				break
			}
			again.Body = body
		} else if req.Body != nil && req.Body != http.NoBody {
			break // a body that cannot be sent again
		}
		resp, err = g.client.Do(again)
	}
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{Response: resp, body: b, err: err}
}

func chat(content string) string {
	return fmt.Sprintf(`{"model":"demo","messages":[{"role":"user","content":%q}]}`, content)
}

const chatPath = "/v1/chat/completions"

// expectError checks a gateway answer against the error schema (docs/api.md, Errors).
func expectError(t *testing.T, r result, status int, code apierr.Code, retryable bool) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("request failed: %v", r.err)
	}
	var e apierr.Body
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("not the error schema: %s", r.body)
	}
	if r.StatusCode != status || e.Error.Code != code || e.Error.Retryable != retryable {
		t.Fatalf("got %d %s retryable=%v, want %d %s retryable=%v: %s", r.StatusCode, e.Error.Code, e.Error.Retryable, status, code, retryable, r.body)
	}
	if e.Error.Message == "" || e.Error.RequestID == "" || e.Error.RequestID != r.Header.Get(headerRequestID) {
		t.Fatalf("message or request_id missing: %s (X-Request-Id %q)", r.body, r.Header.Get(headerRequestID))
	}
	// A retryable answer says when to retry, in the header and in the body (docs/api.md, Errors).
	if secs := fmt.Sprint(e.Error.Details["retry_after_seconds"]); retryable && (r.Header.Get("Retry-After") == "" || secs != r.Header.Get("Retry-After")) {
		t.Fatalf("retryable %s with Retry-After %q and details.retry_after_seconds %s", code, r.Header.Get("Retry-After"), secs)
	}
}

// closeStorages closes every open storage's handle of the gateway, as if the database went
// away.
func (g *gateway) closeStorages() {
	g.registry().eachStorage(func(_ string, s *storage) bool {
		_ = s.be.Close()
		return true
	})
}

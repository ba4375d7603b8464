package module

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/badger"
)

func init() {
	caddy.RegisterModule(panicHandler{})
}

// panicHandler is a downstream handler that panics, as a buggy plugin would.
type panicHandler struct{}

func (panicHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.mulligan_test_panic", New: func() caddy.Module { return new(panicHandler) }}
}

func (panicHandler) ServeHTTP(http.ResponseWriter, *http.Request, caddyhttp.Handler) error {
	panic("a downstream handler's bug")
}

// startSites runs one Caddy with a site per mulligan block body, each on its own port in front
// of one model server, every block on the same storage directory. The first site's gateway
// also holds the admin endpoint.
func startSites(t *testing.T, cfg modelserver.Config, bodies ...string) []*gateway {
	t.Helper()
	cf, sites := sitesConfig(t, cfg, bodies...)
	if err := caddy.Load(cf, true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	t.Cleanup(func() {
		_ = caddy.Stop()
		sites[0].upstream.Close()
		deadline := time.Now().Add(30 * time.Second)
		for badger.IsOpen(sites[0].dir+"/badger") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	})
	return sites
}

// sitesConfig is startSites' config, adapted to JSON, and the gateways it serves.
func sitesConfig(t *testing.T, cfg modelserver.Config, bodies ...string) ([]byte, []*gateway) {
	t.Helper()
	model := modelserver.New(cfg)
	upstream := httptest.NewServer(model)
	dir := t.TempDir()
	ports := testkit.FreePorts(t, len(bodies)+1)
	admin := fmt.Sprintf("127.0.0.1:%d", ports[len(bodies)])
	var b strings.Builder
	fmt.Fprintf(&b, "{\n admin %s\n persist_config off\n auto_https off\n grace_period 500ms\n storage file_system %s/caddy\n log {\n level ERROR\n }\n}\n", admin, dir)
	var sites []*gateway
	for i, body := range bodies {
		fmt.Fprintf(&b, "http://127.0.0.1:%d {\n mulligan {\n storage %s/badger\n %s\n }\n reverse_proxy %s\n}\n",
			ports[i], dir, body, strings.TrimPrefix(upstream.URL, "http://"))
		sites = append(sites, &gateway{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", ports[i]), admin: admin, port: ports[i],
			dir: dir, model: model, upstream: upstream, client: &http.Client{Timeout: 30 * time.Second}})
	}
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(b.String()), nil)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, b.String())
	}
	return out, sites
}

// TestEachBlockKeepsItsSettingsOnASharedStorage: site A with webhooks and
// `timeout 1s`, site B bare with `timeout 30s`, both on one storage. A's 2.5 s call fails with
// OPERATION_TIMEOUT and A's webhook is delivered; B's succeeds and sends nothing.
func TestEachBlockKeepsItsSettingsOnASharedStorage(t *testing.T) {
	rc := newReceiver(t, secretA, nil)
	sites := startSites(t, modelserver.Config{},
		webhooksBlock(rc.srv.URL+"/hook", "", secretA)+"\nasync {\n timeout 1s\n}",
		"async {\n timeout 30s\n}")
	a, b := sites[0], sites[1]
	_, opA := a.submit(t, "site-a", "X-Mock-Latency", "2500ms")
	_, opB := b.submit(t, "site-b", "X-Mock-Latency", "2500ms")
	finalA, finalB := a.await(t, opA.OperationID), b.await(t, opB.OperationID)
	if finalA.Status != "failed" || finalA.Error == nil || finalA.Error.Code != string(CodeOperationTimeout) {
		t.Fatalf("site A's operation: %s %+v, want failed OPERATION_TIMEOUT", finalA.Status, finalA.Error)
	}
	if finalB.Status != "succeeded" {
		t.Fatalf("site B's operation: %s %+v, want succeeded under its own 30s timeout", finalB.Status, finalB.Error)
	}
	waitFor(t, func() bool { return rc.delivered() == 1 })
	rc.mu.Lock()
	ev := rc.events[0]
	rc.mu.Unlock()
	if op, _ := ev["operation"].(map[string]any); ev["event_type"] != EventFailed || op["operation_id"] != opA.OperationID {
		t.Fatalf("site A's event: %v", ev)
	}
	t.Logf("A: %s %s; B: %s; events delivered: %d", finalA.Status, finalA.Error.Code, finalB.Status, rc.delivered())
}

func TestConflictingBlocksOnOneStorageAreRejected(t *testing.T) {
	hooks := func(url string) string {
		return fmt.Sprintf("webhooks {\n endpoint shared %s {\n secret %s\n }\n allow_private\n}", url, secretA)
	}
	for _, tc := range []struct {
		name, a, b, message string
	}{
		{"concurrency", "async {\n concurrency 2\n}", "async {\n concurrency 8\n}",
			"set concurrency differently ("},
		{"takeover", "async {\n takeover 10s\n}", "async {\n takeover 20s\n}",
			"set takeover differently ("},
		{"durability", "durability relaxed", "durability sync", "set durability differently ("},
		{"encryption key", "encryption_key 0123456789abcdef", "encryption_key fedcba9876543210", "set different encryption keys"},
		{"endpoint", hooks("http://127.0.0.1:9/a"), hooks("http://127.0.0.1:9/b"),
			`declare webhook endpoint "shared" with different settings`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf, _ := sitesConfig(t, modelserver.Config{}, tc.a, tc.b)
			err := caddy.Validate(mustConfig(t, cf))
			if err == nil || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("got %v, want an error saying %q", err, tc.message)
			}
		})
	}
	// The same settings, or one block setting them alone, share the storage fine.
	cf, _ := sitesConfig(t, modelserver.Config{}, "async {\n concurrency 2\n}\n"+hooks("http://127.0.0.1:9/a"), hooks("http://127.0.0.1:9/a"))
	if err := caddy.Validate(mustConfig(t, cf)); err != nil {
		t.Fatalf("agreeing blocks refused: %v", err)
	}
}

func mustConfig(t *testing.T, raw []byte) *caddy.Config {
	t.Helper()
	var c caddy.Config
	if err := caddy.StrictUnmarshalJSON(raw, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

func TestPanickingHandlerFailsTheOperationNotTheProcess(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	// Reload with a route whose next handler panics (a buggy plugin).
	cf := strings.Replace(string(g.config("")), `{"handler":"reverse_proxy"`, `{"handler":"mulligan_test_panic"},{"handler":"reverse_proxy"`, 1)
	if err := caddy.Load([]byte(cf), true); err != nil {
		t.Fatal(err)
	}
	_, op := g.submit(t, "panics")
	final := g.await(t, op.OperationID)
	if final.Status != "failed" || final.Error == nil || final.Error.Code != string(CodeUpstreamError) || final.Attempts != 1 {
		t.Fatalf("operation: %s attempts=%d %+v, want failed UPSTREAM_ERROR after one attempt", final.Status, final.Attempts, final.Error)
	}
	if r := g.get(pathLive); r.StatusCode != 200 {
		t.Fatalf("the gateway is not serving after the panic: %v %d", r.err, r.StatusCode)
	}
}

// TestCancelRacingCompletionNeverAnswersASuccess cancels operations around the moment they
// finish: each answer is the canceled operation, 202 while stopping, or 409
// OPERATION_ALREADY_FINAL; never 200 with an operation that succeeded.
func TestCancelRacingCompletionNeverAnswersASuccess(t *testing.T) {
	g := startGateway(t, modelserver.Config{Latency: 150 * time.Millisecond}, "async {\n concurrency 16\n}")
	const n = 40
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, op := g.submit(t, fmt.Sprintf("race-%d", i))
			waitFor(t, func() bool { return decodeOp(t, g.get("/v1/operations/"+op.OperationID)).Status != "queued" })
			time.Sleep(time.Duration(100+3*i) * time.Millisecond) // around the 150 ms the call takes
			r := g.post(op.Links.Cancel, "", "")
			outcome := fmt.Sprintf("%d %s", r.StatusCode, r.errorCode())
			if r.StatusCode == 200 || r.StatusCode == 202 {
				outcome = fmt.Sprintf("%d %s", r.StatusCode, decodeOp(t, r).Status)
			}
			mu.Lock()
			counts[outcome]++
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("cancel answers around completion: %v", counts)
	for outcome, k := range counts {
		switch outcome {
		case "200 canceled", "409 " + string(CodeAlreadyFinal), "202 running":
		default:
			t.Errorf("%d cancels answered %s", k, outcome)
		}
	}
}

// TestUpstreamRetryAfterIsHonouredUpToTheTimeout: a 503 asking for 11 s is retried after 11 s
// (over the 10 s cap of the backoff itself) when the timeout leaves room, and ends the
// operation at once when it does not.
func TestUpstreamRetryAfterIsHonouredUpToTheTimeout(t *testing.T) {
	for _, tc := range []struct {
		timeout  string
		status   string
		attempts int64
	}{
		{"30s", "succeeded", 2},
		{"5s", "failed", 1},
	} {
		t.Run("timeout "+tc.timeout, func(t *testing.T) {
			var calls atomic.Int64
			var mu sync.Mutex
			var at []time.Time
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				at = append(at, time.Now())
				mu.Unlock()
				if calls.Add(1) == 1 {
					w.Header().Set("Retry-After", "11")
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				_, _ = w.Write([]byte(`{"ok":true}`))
			}))
			g := startGateway(t, modelserver.Config{}, "")
			defer g.upstream.Close()
			g.upstream = up // the route now proxies to up
			g.reload("async {\n timeout " + tc.timeout + "\n}")
			started := time.Now()
			_, op := g.submit(t, "retry-after")
			final := g.awaitFor(t, op.OperationID, 30*time.Second)
			if final.Status != tc.status || calls.Load() != tc.attempts {
				t.Fatalf("%s after %d upstream calls, want %s after %d", final.Status, calls.Load(), tc.status, tc.attempts)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(at) == 2 {
				gap := at[1].Sub(at[0])
				t.Logf("the retry came %v after the 503 with Retry-After: 11", gap.Round(10*time.Millisecond))
				if gap < 11*time.Second {
					t.Fatalf("retried after %v, before the upstream's Retry-After", gap)
				}
			} else {
				t.Logf("gave up at once: final after %v", time.Since(started).Round(10*time.Millisecond))
				if time.Since(started) > 4*time.Second {
					t.Fatalf("waited %v for a retry that could not fit in the timeout", time.Since(started))
				}
			}
		})
	}
}

// awaitFor is await with its own bound.
func (g *gateway) awaitFor(t *testing.T, id string, bound time.Duration) opBody {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		op := decodeOp(t, g.get("/v1/operations/"+id))
		if op.Done {
			return op
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s still %s after %v", id, op.Status, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCallConvertedAfterItsWindowAnnouncesRunning(t *testing.T) {
	rc := newReceiver(t, secretA, nil)
	g := startGateway(t, modelserver.Config{}, "async {\n mode after 200ms\n}\n"+
		webhooksBlock(rc.srv.URL+"/hook", "events operation.running operation.succeeded", secretA))
	r := g.post(chatPath, "converted", chat("slow"), "X-Mock-Latency", "1s")
	if r.StatusCode != http.StatusAccepted {
		t.Fatalf("not converted: %d %s", r.StatusCode, r.body)
	}
	op := decodeOp(t, r)
	g.await(t, op.OperationID)
	waitFor(t, func() bool { return rc.delivered() == 2 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var types []string
	for _, ev := range rc.events {
		types = append(types, fmt.Sprint(ev["event_type"]))
	}
	if strings.Join(types, ",") != EventRunning+","+EventSucceeded {
		t.Fatalf("events: %v", types)
	}
}

// TestReloadWhileAnOperationRunsNeitherRequeuesNorRepeatsIt reloads twice while a call runs:
// once keeping the storage's runner, once opening the storage anew (durability changed), so
// a second runner starts beside the first during its grace period.
func TestReloadWhileAnOperationRunsNeitherRequeuesNorRepeatsIt(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	_, op := g.submit(t, "long", "X-Mock-Latency", "2s")
	waitFor(t, func() bool { return g.model.Stats().InFlight == 1 })
	g.reload("idempotency {\n ttl 48h\n}")
	g.reload("durability relaxed")
	final := g.await(t, op.OperationID)
	s := g.model.Stats()
	t.Logf("%s after %d attempt(s); the model server ran %d time(s)", final.Status, final.Attempts, s.Received)
	if final.Status != "succeeded" || final.Attempts != 1 || s.Received != 1 {
		t.Fatalf("%s, %d attempts, %d upstream runs: want succeeded once", final.Status, final.Attempts, s.Received)
	}
}

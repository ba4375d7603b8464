package module

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/badger"
)

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
// `timeout 300ms`, site B bare with `timeout 30s`, both on one storage. A's 1 s call fails with
// OPERATION_TIMEOUT and A's webhook is delivered; B's succeeds and sends nothing.
func TestEachBlockKeepsItsSettingsOnASharedStorage(t *testing.T) {
	rc := newReceiver(t, secretA, nil)
	sites := startSites(t, modelserver.Config{},
		webhooksBlock(rc.srv.URL+"/hook", "", secretA)+"\nasync {\n timeout 300ms\n}",
		"async {\n timeout 30s\n}")
	a, b := sites[0], sites[1]
	_, opA := a.submit(t, "site-a", "X-Mock-Latency", "1s")
	_, opB := b.submit(t, "site-b", "X-Mock-Latency", "1s")
	finalA, finalB := a.await(t, opA.OperationID), b.await(t, opB.OperationID)
	if finalA.Status != "failed" || finalA.Error == nil || finalA.Error.Code != string(apierr.CodeOperationTimeout) {
		t.Fatalf("site A's operation: %s %+v, want failed OPERATION_TIMEOUT", finalA.Status, finalA.Error)
	}
	if finalB.Status != "succeeded" {
		t.Fatalf("site B's operation: %s %+v, want succeeded under its own 30s timeout", finalB.Status, finalB.Error)
	}
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 1", func() bool { return rc.delivered() == 1 })
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

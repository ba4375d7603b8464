package module

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// scrape returns the value of every sample of the admin endpoint's /metrics whose name starts
// with mulligan_, keyed by the sample's name and labels.
func (g *gateway) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range strings.Split(g.adminCall("GET", "/metrics"), "\n") {
		if !strings.HasPrefix(line, "mulligan_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

func sum(samples map[string]float64, prefix string) float64 {
	total := 0.0
	for k, v := range samples {
		if strings.HasPrefix(k, prefix) {
			total += v
		}
	}
	return total
}

func TestMetricsArePresentAndKeepCountingAcrossReloads(t *testing.T) {
	rc := newReceiver(t, secretA, nil)
	block := webhooksBlock(rc.srv.URL+"/hook", "", secretA) + "\nasync {\n retries 1\n}" // one retry counts as well as three, sooner
	g := startGateway(t, modelserver.Config{}, block)
	traffic := func(round int) {
		first := g.post(chatPath, fmt.Sprintf("m-%d", round), chat("x"))
		again := g.post(chatPath, fmt.Sprintf("m-%d", round), chat("x"))
		if first.err != nil || again.err != nil {
			t.Fatalf("round %d: a keyed request and its replay: %v, %v", round, first.err, again.err)
		}
		if again.Header.Get(headerReplayed) != "true" {
			t.Fatalf("round %d: the keyed request was not replayed: %d %s", round, again.StatusCode, again.body)
		}
		_, op := g.submit(t, fmt.Sprintf("mo-%d", round))
		g.await(t, op.OperationID)
		_, failing := g.submit(t, "", "X-Mock-Status", "503")
		g.await(t, failing.OperationID)
		testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 2*(round+1)", func() bool { return rc.delivered() == 2*(round+1) })
	}
	traffic(0)
	before := g.scrape(t)
	for _, name := range []string{
		`mulligan_requests_total{outcome="new"}`, `mulligan_requests_total{outcome="replayed"}`, `mulligan_requests_total{outcome="accepted"}`,
		`mulligan_operations_finished_total{error_code="",status="succeeded"}`,
		`mulligan_operations_finished_total{error_code="UPSTREAM_UNAVAILABLE",status="failed"}`,
		"mulligan_operation_queue_wait_seconds_count", "mulligan_operation_execution_seconds_count",
		"mulligan_upstream_retries_total", `mulligan_webhook_attempts_total{endpoint="hooks",result="delivered"}`,
		"mulligan_store_fsync_batch_size_count",
	} {
		if before[name] <= 0 {
			t.Errorf("%s is missing or zero", name)
		}
	}
	for _, prefix := range []string{"mulligan_queue_depth{", "mulligan_operations_running{", "mulligan_webhook_events_pending{",
		"mulligan_webhook_events_dead{", "mulligan_webhook_breaker_state{", "mulligan_store_size_bytes{"} {
		found := false
		for k := range before {
			found = found || strings.HasPrefix(k, prefix)
		}
		if !found {
			t.Errorf("no %s sample", prefix)
		}
	}
	g.reload(block + "\nidempotency {\n ttl 2h\n}")
	traffic(1)
	after := g.scrape(t)
	for _, name := range []string{`mulligan_requests_total{outcome="new"}`, `mulligan_requests_total{outcome="replayed"}`, "mulligan_operation_execution_seconds_count"} {
		if after[name] <= before[name] {
			t.Errorf("%s did not count on after the reload: %v then %v", name, before[name], after[name])
		}
	}
	t.Logf("after the reload: %d mulligan samples; requests new=%v replayed=%v; operations finished=%v",
		len(after), after[`mulligan_requests_total{outcome="new"}`], after[`mulligan_requests_total{outcome="replayed"}`], sum(after, "mulligan_operations_finished_total"))
}

func TestReadinessFollowsTheStoreAndTheQueue(t *testing.T) {
	g := startGateway(t, modelserver.Config{Latency: 10 * time.Second}, "async {\n concurrency 1\n queue 1\n}")
	if r := g.get(pathReady); r.StatusCode != 200 {
		t.Fatalf("ready: %d %s", r.StatusCode, r.body)
	}
	if r := g.get(pathLive); r.StatusCode != 200 {
		t.Fatalf("live: %d", r.StatusCode)
	}
	_, running := g.submit(t, "")
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	_, queued := g.submit(t, "")
	expectError(t, g.get(pathReady), 503, apierr.CodeQueueFull, true)
	g.post(queued.Links.Cancel, "", "")
	if r := g.get(pathReady); r.StatusCode != 200 {
		t.Fatalf("not ready again once the queue drained: %d %s", r.StatusCode, r.body)
	}
	g.post(running.Links.Cancel, "", "") // its 10 s call would hold the stop of the config

	g.closeStorages()
	expectError(t, g.get(pathReady), 503, apierr.CodeStorage, true)
	// A config that opens the storage differently gets a handle of its own.
	g.reload("durability relaxed\nasync {\n concurrency 1\n queue 2\n}")
	if r := g.get(pathReady); r.StatusCode != 200 {
		t.Fatalf("not ready after the store came back: %d %s", r.StatusCode, r.body)
	}
}

// TestLogsNeverHoldSecretsScopesOrBodies drives keyed, async and webhook traffic carrying a
// known secret, Authorization header and body marker, at debug level, and reads every log line.
func TestLogsNeverHoldSecretsScopesOrBodies(t *testing.T) {
	const token, marker = "Bearer tok-5f3c9e-PRIVATE", "BODY-MARKER-7d1a"
	rc := newReceiver(t, secretA, nil)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	g := startGatewayWithGlobals(t, modelserver.Config{}, fmt.Sprintf("log {\n output file %s\n level DEBUG\n }", logFile),
		"scope {http.request.header.Authorization}\n"+webhooksBlock(rc.srv.URL+"/hook", "", secretA))
	h := []string{"Authorization", token}
	g.post(chatPath, "log-key", chat(marker), h...)
	g.post(chatPath, "log-key", chat(marker), h...)
	g.post(chatPath, "log-key", chat("other "+marker), h...)
	r := g.post(chatPath, "log-async", chat(marker), append(h, "Prefer", "respond-async")...)
	g.await(t, decodeOp(t, r).OperationID, h...)
	g.submit(t, "", append(h, "X-Mock-Status", "500")...)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 2", func() bool { return rc.delivered() == 2 })
	_ = caddy.Stop()
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), `"idempotency_key":"log-key"`) || !strings.Contains(string(logs), "operation_id") {
		t.Fatalf("the log lacks the fields it should have:\n%s", logs)
	}
	secretBody := strings.TrimPrefix(secretA, "whsec_")
	for name, forbidden := range map[string]string{"webhook secret": secretBody, "Authorization": "tok-5f3c9e", "body": marker} {
		if strings.Contains(string(logs), forbidden) {
			line := regexp.MustCompile(`.*` + regexp.QuoteMeta(forbidden) + `.*`).FindString(string(logs))
			t.Errorf("the %s appears in the logs: %s", name, line)
		}
	}
	t.Logf("%d log lines checked", strings.Count(string(logs), "\n"))
}

func TestAdminListsEveryScopeAndEvictsKeys(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "scope {http.request.header.Authorization}")
	_, a := g.submit(t, "", "Authorization", "Bearer alice")
	_, b := g.submit(t, "", "Authorization", "Bearer bob")
	list := g.adminCall("GET", "/mulligan/operations")
	if !strings.Contains(list, a.OperationID) || !strings.Contains(list, b.OperationID) {
		t.Fatalf("the admin list lacks an operation: %s", list)
	}
	g.post(chatPath, "evict-me", chat("x"), "Authorization", "Bearer alice")
	req := `{"scope":"Bearer alice","method":"POST","path":"/v1/chat/completions","key":"evict-me"}`
	resp, err := adminClient.Post("http://"+g.admin+"/mulligan/keys/evict", "application/json", strings.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"evicted":true`) {
		t.Fatalf("evict: %d %s", resp.StatusCode, body)
	}
	if r := g.post(chatPath, "evict-me", chat("x"), "Authorization", "Bearer alice"); r.Header.Get(headerReplayed) != "" {
		t.Fatal("an evicted key still replayed")
	}
	if n := g.model.Stats().ByKey["evict-me"]; n != 2 {
		t.Fatalf("the evicted key ran %d times, want 2", n)
	}
}

// TestOperatingDocCaddyfilesLoad: every Caddyfile in docs/operating.md adapts and provisions (the
// laptop recipe's three replicas run it), and the recipe's binds loopback only.
func TestOperatingDocCaddyfilesLoad(t *testing.T) {
	doc, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PORT", "8081")
	t.Setenv("ADMIN", "2021")
	t.Setenv("MULLIGAN_POSTGRES_URL", "postgres://mulligan@127.0.0.1:1/mulligan") // validating opens no storage
	blocks := regexp.MustCompile("(?s)```caddyfile\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) == 0 {
		t.Fatal("docs/operating.md has no ```caddyfile block")
	}
	for _, m := range blocks {
		out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(m[1], map[string]any{"filename": "operating.md"})
		if err != nil || len(warnings) > 0 {
			t.Fatalf("%v %v\n%s", err, warnings, m[1])
		}
		if strings.Contains(string(m[1]), "{$PORT}") && !strings.Contains(string(out), `"listen":["127.0.0.1:8081"]`) {
			t.Errorf("the recipe's Caddyfile does not listen on loopback only: %s", out)
		}
		var cfg caddy.Config
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatal(err)
		}
		if err := caddy.Validate(&cfg); err != nil {
			t.Errorf("%v\n%s", err, m[1])
		}
	}
}

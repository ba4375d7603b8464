package module

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
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

func TestPanickingHandlerFailsTheOperationNotTheProcess(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	// Reload with a route whose next handler panics (a buggy plugin).
	cf := strings.Replace(string(g.config("")), `{"handler":"reverse_proxy"`, `{"handler":"mulligan_test_panic"},{"handler":"reverse_proxy"`, 1)
	g.load([]byte(cf)) // once the old config serves nothing more
	_, op := g.submit(t, "panics")
	final := g.await(t, op.OperationID)
	if final.Status != "failed" || final.Error == nil || final.Error.Code != string(apierr.CodeUpstreamError) || final.Attempts != 1 {
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
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 150 * time.Millisecond}, "async {\n concurrency 16\n}")
	const n = 40
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, op := g.submit(t, fmt.Sprintf("race-%d", i))
			testkit.WaitFor(t, 5*time.Second, `decodeOp(t, g.get("/v1/operations/"+op.OperationID)).Status != "queued"`, func() bool { return decodeOp(t, g.get("/v1/operations/"+op.OperationID)).Status != "queued" })
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
		case "200 canceled", "409 " + string(apierr.CodeAlreadyFinal), "202 running":
		default:
			t.Errorf("%d cancels answered %s", k, outcome)
		}
	}
}

func TestCallConvertedAfterItsWindowAnnouncesRunning(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, secretA, nil)
	g := startHandler(t, modelserver.Config{}, "async {\n mode after 200ms\n}\n"+
		webhooksBlock(rc.srv.URL+"/hook", "events operation.running operation.succeeded", secretA))
	r := g.post(chatPath, "converted", chat("slow"), "X-Mock-Latency", "1s")
	if r.StatusCode != http.StatusAccepted {
		t.Fatalf("not converted: %d %s", r.StatusCode, r.body)
	}
	op := decodeOp(t, r)
	g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 2", func() bool { return rc.delivered() == 2 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	// Events of one operation may arrive out of order (docs/webhooks.md); their versions order them.
	byVersion := map[float64]string{}
	for _, ev := range rc.events {
		op, _ := ev["operation"].(map[string]any)
		version, _ := op["version"].(float64)
		byVersion[version] = fmt.Sprint(ev["event_type"])
	}
	versions := slices.Sorted(maps.Keys(byVersion))
	var types []string
	for _, v := range versions {
		types = append(types, byVersion[v])
	}
	if len(versions) != 2 || strings.Join(types, ",") != EventRunning+","+EventSucceeded {
		t.Fatalf("events by operation version: %v %v", versions, types)
	}
}

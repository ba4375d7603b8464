package module

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// opBody is the parts of an operation the tests read.
type opBody struct {
	OperationID       string `json:"operation_id"`
	Status            string `json:"status"`
	Done              bool   `json:"done"`
	Version           int64  `json:"version"`
	Attempts          int    `json:"attempts"`
	Urgency           int    `json:"urgency"`
	QueuePosition     *int   `json:"queue_position"`
	StatusURL         string `json:"status_url"`
	CancelRequestedAt string `json:"cancel_requested_at"`
	Response          *struct {
		Status int             `json:"status"`
		Body   json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code      string `json:"code"`
		Retryable bool   `json:"retryable"`
	} `json:"error"`
	Links struct{ Self, Cancel, Result string } `json:"links"`
}

func decodeOp(t *testing.T, r result) opBody {
	t.Helper()
	var op opBody
	if r.err != nil || json.Unmarshal(r.body, &op) != nil {
		t.Fatalf("not an operation: %v %s", r.err, r.body)
	}
	return op
}

// submit sends an async chat completion and returns the 202's operation.
func (g *gateway) submit(t *testing.T, key string, headers ...string) (result, opBody) {
	t.Helper()
	r := g.post(chatPath, key, chat("async "+key), append([]string{"Prefer", "respond-async"}, headers...)...)
	// A reload can reset a connection in the old listener's backlog (Caddy binds each config's
	// listener with SO_REUSEPORT); a keyed submit is safe to retry, as any client would.
	for retry := 0; r.err != nil && key != "" && retry < 3; retry++ {
		r = g.post(chatPath, key, chat("async "+key), append([]string{"Prefer", "respond-async"}, headers...)...)
	}
	if r.err != nil {
		t.Fatalf("submit: %v", r.err)
	}
	if r.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: %s %s", r.Status, r.body)
	}
	return r, decodeOp(t, r)
}

func (g *gateway) get(path string, headers ...string) result {
	req, _ := http.NewRequest("GET", g.base+path, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return g.do(req)
}

// await polls the operation until it is final.
func (g *gateway) await(t *testing.T, id string, headers ...string) opBody {
	t.Helper()
	var op opBody
	testkit.WaitFor(t, 20*time.Second, "operation "+id+" final", func() bool {
		op = decodeOp(t, g.get("/v1/operations/"+id, headers...))
		return op.Done
	})
	return op
}

func TestPreferRespondAsyncAnswers202ThenPollThenResult(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 200 * time.Millisecond}, "")
	r, op := g.submit(t, "")
	for h, want := range map[string]string{
		"Location": "/v1/operations/" + op.OperationID, "Preference-Applied": "respond-async", "Retry-After": "2", "Vary": "Prefer",
	} {
		if got := r.Header.Get(h); got != want {
			t.Errorf("202 %s: %q, want %q", h, got, want)
		}
	}
	if op.Status != "queued" || op.Done || !strings.HasPrefix(op.OperationID, "op_") || op.Links.Result != op.StatusURL+"/result" {
		t.Fatalf("202 body: %s", r.body)
	}
	poll := g.get(op.StatusURL)
	if p := decodeOp(t, poll); !p.Done && poll.Header.Get("Retry-After") == "" {
		t.Error("a pending operation has no Retry-After")
	}
	final := g.await(t, op.OperationID)
	if final.Status != "succeeded" || final.Response == nil || final.Response.Status != 200 || final.Attempts != 1 || final.Version != 3 {
		t.Fatalf("final: %+v", final)
	}
	res := g.get(op.Links.Result)
	if res.StatusCode != 200 || res.Header.Get(modelserver.HeaderExecutionID) == "" || !json.Valid(res.body) {
		t.Fatalf("result: %d %s", res.StatusCode, res.body)
	}
	var inline, raw any
	_ = json.Unmarshal(final.Response.Body, &inline)
	_ = json.Unmarshal(res.body, &raw)
	if fmt.Sprint(inline) != fmt.Sprint(raw) {
		t.Fatalf("inline body differs from the result:\n%s\n%s", final.Response.Body, res.body)
	}
	if n := g.model.Stats().Received; n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

func TestSynchronousResponsesOfCoveredRoutesVaryOnPrefer(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "")
	r := g.post(chatPath, "", chat("x"))
	if r.StatusCode != 200 || !strings.Contains(strings.Join(r.Header.Values("Vary"), ","), "Prefer") {
		t.Fatalf("%d Vary=%q", r.StatusCode, r.Header.Values("Vary"))
	}
}

func TestKeyedAsyncRetryGetsTheSame202(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "")
	first, op := g.submit(t, "async-key")
	again, op2 := g.submit(t, "async-key")
	if op2.OperationID != op.OperationID || again.Header.Get(headerReplayed) != "true" || string(again.body) != string(first.body) {
		t.Fatalf("retry: %s replayed=%q", again.body, again.Header.Get(headerReplayed))
	}
	g.await(t, op.OperationID)
	if n := g.model.Stats().Received; n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

func TestCancelQueuedRunningAndFinalOperations(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 10 * time.Second}, "async {\n concurrency 1\n}")
	_, running := g.submit(t, "running")
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	_, queued := g.submit(t, "queued")

	c := g.post(queued.Links.Cancel, "", "")
	if op := decodeOp(t, c); c.StatusCode != 200 || op.Status != "canceled" {
		t.Fatalf("cancel queued: %d %s", c.StatusCode, c.body)
	}
	req, _ := http.NewRequest("DELETE", g.base+running.StatusURL, nil)
	c = g.do(req)
	if op := decodeOp(t, c); c.StatusCode != 200 || op.Status != "canceled" || op.CancelRequestedAt == "" {
		t.Fatalf("cancel running: %d %s", c.StatusCode, c.body)
	}
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().Abandoned == 1", func() bool { return g.model.Stats().Abandoned == 1 })
	expectError(t, g.post(running.Links.Cancel, "", ""), 409, apierr.CodeAlreadyFinal, false)
	if n := g.model.Stats().ByKey["queued"]; n != 0 {
		t.Fatalf("a canceled queued operation reached the upstream %d times", n)
	}
	expectError(t, g.get(queued.Links.Result), 404, apierr.CodeOperationNotFound, false)
}

func TestResultBeforeTheEndIs409(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 5 * time.Second}, "")
	_, op := g.submit(t, "")
	r := g.get(op.Links.Result)
	expectError(t, r, 409, apierr.CodeNotFinished, true)
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
}

func TestAfterModeAnswersFastCallsDirectlyAndConvertsSlowOnes(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "async {\n mode after 1s\n}")
	fast := g.post(chatPath, "fast", chat("fast"), "X-Mock-Latency", "50ms")
	if fast.StatusCode != 200 || fast.Header.Get("Preference-Applied") != "" {
		t.Fatalf("fast: %d %s", fast.StatusCode, fast.body)
	}
	slow := g.post(chatPath, "slow", chat("slow"), "X-Mock-Latency", "1500ms")
	if slow.StatusCode != 202 || slow.Header.Get("Preference-Applied") != "respond-async" {
		t.Fatalf("slow: %d %s", slow.StatusCode, slow.body)
	}
	op := g.await(t, decodeOp(t, slow).OperationID)
	if op.Status != "succeeded" || op.Attempts != 1 {
		t.Fatalf("converted: %+v", op)
	}
	for key, first := range map[string]result{"fast": fast, "slow": slow} {
		again := g.post(chatPath, key, chat(key), "X-Mock-Latency", "50ms")
		if again.Header.Get(headerReplayed) != "true" || string(again.body) != string(first.body) || again.StatusCode != first.StatusCode {
			t.Errorf("%s did not replay: %d %s", key, again.StatusCode, again.body)
		}
	}
	if n := g.model.Stats().Received; n != 2 {
		t.Fatalf("upstream ran %d times, want 2", n)
	}
	// Prefer: wait=N sets the window per request.
	if r := g.post(chatPath, "", chat("w"), "X-Mock-Latency", "300ms", "Prefer", "wait=0"); r.StatusCode != 202 {
		t.Fatalf("wait=0: %d", r.StatusCode)
	}
}

func TestFullQueueAnswers503(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 10 * time.Second}, "async {\n concurrency 1\n queue 1\n}")
	g.submit(t, "a")
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	g.submit(t, "b")
	r := g.post(chatPath, "c", chat("c"), "Prefer", "respond-async")
	expectError(t, r, 503, apierr.CodeQueueFull, true)
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
}

// A client that lost its 202 (it disconnected while the answer was written) retries with its
// key: the retry is a replay of the accepted request, not a new one, so a full queue does not
// stand between the client and its operation id.
func TestKeyedRetryOfAnAcceptedRequestIsReplayedWhenTheQueueIsFull(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 10 * time.Second}, "async {\n concurrency 1\n queue 1\n}")
	g.submit(t, "a")
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	first, op := g.submit(t, "b")
	expectError(t, g.post(chatPath, "c", chat("async c"), "Prefer", "respond-async"), 503, apierr.CodeQueueFull, true)
	again := g.post(chatPath, "b", chat("async b"), "Prefer", "respond-async")
	if again.err != nil || again.StatusCode != http.StatusAccepted || again.Header.Get(headerReplayed) != "true" || string(again.body) != string(first.body) {
		t.Fatalf("the retry of accepted operation %s got %v replayed=%q: %s", op.OperationID, again.Status, again.Header.Get(headerReplayed), again.body)
	}
}

func TestAnotherScopesOperationIsNotFound(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "scope {http.request.header.Authorization}")
	_, op := g.submit(t, "", "Authorization", "Bearer alice")
	g.await(t, op.OperationID, "Authorization", "Bearer alice")
	foreign := g.get(op.StatusURL, "Authorization", "Bearer bob")
	missing := g.get("/v1/operations/op_doesnotexist", "Authorization", "Bearer bob")
	expectError(t, foreign, 404, apierr.CodeOperationNotFound, false)
	expectError(t, missing, 404, apierr.CodeOperationNotFound, false)
	var a, b apierr.Body
	_ = json.Unmarshal(foreign.body, &a)
	_ = json.Unmarshal(missing.body, &b)
	if strings.ReplaceAll(a.Error.Message, op.OperationID, "X") != strings.ReplaceAll(b.Error.Message, "op_doesnotexist", "X") {
		t.Fatalf("the answers differ: %q vs %q", a.Error.Message, b.Error.Message)
	}
	expectError(t, g.post(op.Links.Cancel, "", "", "Authorization", "Bearer bob"), 404, apierr.CodeOperationNotFound, false)
	if list := g.get("/v1/operations", "Authorization", "Bearer bob"); strings.Contains(string(list.body), op.OperationID) {
		t.Fatal("bob's list shows alice's operation")
	}
}

func TestUpstreamOutcomesMapToOperationStatuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		headers   []string
		status    string
		code      string
		retryable bool
		attempts  int
	}{
		{"2xx succeeds", nil, "succeeded", "", false, 1},
		{"4xx is rejected", []string{"X-Mock-Status", "400"}, "failed", "UPSTREAM_REJECTED", false, 1},
		{"503 is retried, then unavailable", []string{"X-Mock-Status", "503"}, "failed", "UPSTREAM_UNAVAILABLE", true, 3},
		{"429 is retried, then unavailable", []string{"X-Mock-Status", "429"}, "failed", "UPSTREAM_UNAVAILABLE", true, 3},
		{"a dropped connection is retried", []string{"X-Mock-Fail", "drop"}, "failed", "UPSTREAM_UNAVAILABLE", true, 3},
		{"other 5xx is an upstream error", []string{"X-Mock-Status", "500"}, "failed", "UPSTREAM_ERROR", true, 1},
		{"over the timeout", []string{"X-Mock-Latency", "2s"}, "failed", "OPERATION_TIMEOUT", true, 1},
		{"over max_result", []string{"X-Mock-Body-Bytes", "10000"}, "failed", "RESULT_TOO_LARGE", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			timeout := "10s"
			if tc.code == "OPERATION_TIMEOUT" {
				timeout = "500ms"
			}
			g := startHandler(t, modelserver.Config{}, "async {\n retries 2\n timeout "+timeout+"\n max_result 4KiB\n}")
			_, op := g.submit(t, "", tc.headers...)
			final := g.await(t, op.OperationID)
			code, retryable := "", false
			if final.Error != nil {
				code, retryable = final.Error.Code, final.Error.Retryable
			}
			if final.Status != tc.status || code != tc.code || retryable != tc.retryable || final.Attempts != tc.attempts {
				t.Fatalf("got %s %s retryable=%v attempts=%d", final.Status, code, retryable, final.Attempts)
			}
			if tc.code == "UPSTREAM_REJECTED" && (final.Response == nil || final.Response.Status != 400) {
				t.Fatal("a failed operation lost the upstream response")
			}
		})
	}
}

func TestListShowsTheCallersOperationsNewestFirst(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "")
	alice := []string{"Authorization", "Bearer alice"}
	var ids []string
	for i := range 3 {
		_, op := g.submit(t, fmt.Sprintf("list-%d", i), alice...)
		ids = append(ids, op.OperationID)
		g.await(t, op.OperationID, alice...)
	}
	var page struct {
		Operations []opBody `json:"operations"`
		NextAfter  string   `json:"next_after"`
	}
	_ = json.Unmarshal(g.get("/v1/operations?limit=2&status=succeeded", alice...).body, &page)
	if len(page.Operations) != 2 || page.Operations[0].OperationID != ids[2] || page.NextAfter != ids[1] {
		t.Fatalf("first page: %+v", page)
	}
	_ = json.Unmarshal(g.get("/v1/operations?limit=2&after="+page.NextAfter, alice...).body, &page)
	if len(page.Operations) != 1 || page.Operations[0].OperationID != ids[0] {
		t.Fatalf("second page: %+v", page)
	}
	expectError(t, g.get("/v1/operations?status=bogus"), 400, apierr.CodeInvalidRequest, false)
}

// A cancel asked for by a client is not an error (docs/operating.md): canceling a running
// operation closes its upstream call, and no error-level line is logged for it (reverse_proxy
// logged the canceled call as a 502 at error level, with the request's headers); the cancel
// itself is logged at info.
func TestCancelOfARunningOperationLogsNoError(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	g := startGatewayWith(t, gatewaySetup{model: modelserver.Config{Latency: 10 * time.Second},
		globals: "log {\n output file " + logFile + "\n format json\n level INFO\n }"})
	_, op := g.submit(t, "to-cancel")
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	if c := g.post(op.Links.Cancel, "", ""); c.StatusCode != 200 {
		t.Fatalf("cancel: %d %s", c.StatusCode, c.body)
	}
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().Abandoned == 1", func() bool { return g.model.Stats().Abandoned == 1 })
	// The transition's line is logged after the upstream call has returned, so any line the
	// call's end logs is in the file by then.
	testkit.WaitFor(t, 5*time.Second, "the cancel's transition logged", func() bool {
		for _, line := range logLines(t, logFile, "operation_id", op.OperationID) {
			if line["new_status"] == "canceled" && line["level"] == "info" {
				return true
			}
		}
		return false
	})
	if errs := logLines(t, logFile, "level", "error"); len(errs) > 0 {
		t.Fatalf("a client's cancel logged at error level: %v", errs)
	}
}

package module

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

func TestAnswersWithinTheWindowThatAreNotWholeFailInTheErrorSchema(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "async {\n mode after 10s\n max_result 1KiB\n}")
	for _, tc := range []struct {
		name      string
		key       string
		headers   []string
		status    int
		code      apierr.Code
		retryable bool
	}{
		{"an answer over max_result", "big", []string{"X-Mock-Body-Bytes", "4096"}, 502, apierr.CodeResultTooLarge, false},
		{"a keyless answer over max_result", "", []string{"X-Mock-Body-Bytes", "4096"}, 502, apierr.CodeResultTooLarge, false},
		{"a dropped connection", "drop", []string{"X-Mock-Fail", "drop"}, 502, apierr.CodeUpstreamUnavailable, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := g.post(chatPath, tc.key, chat("x"), tc.headers...)
			expectError(t, r, tc.status, tc.code, tc.retryable)
			if r.Header.Get(headerExpires) != "" {
				t.Fatal("an answer that was not recorded carries Idempotency-Expires")
			}
		})
	}
	before := g.model.Stats().Received
	g.post(chatPath, "big", chat("x"), "X-Mock-Body-Bytes", "4096")
	if n := g.model.Stats().Received - before; n != 1 {
		t.Fatalf("the key of a failed answer was not released: the retry ran %d times", n)
	}
}

func TestCallOverTheTimeoutWithinTheWindowIsOperationTimeout(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "async {\n mode after 10s\n timeout 500ms\n}")
	r := g.post(chatPath, "k", chat("x"), "X-Mock-Latency", "5s")
	expectError(t, r, http.StatusGatewayTimeout, apierr.CodeOperationTimeout, true)
	if !strings.Contains(string(r.body), "within the async timeout") {
		t.Fatalf("the timeout does not say so: %s", r.body)
	}
}

func TestPanickingHandlerWithinTheWindowIsUpstreamError(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "async {\n mode after 10s\n}")
	cf := strings.Replace(string(g.config("async {\n mode after 10s\n}")), `{"handler":"reverse_proxy"`, `{"handler":"mulligan_test_panic"},{"handler":"reverse_proxy"`, 1)
	g.load([]byte(cf))                                     // once the old config serves nothing more
	for _, key := range []string{"panics", "panics", ""} { // the key is released: its retry runs again
		r := g.post(chatPath, key, chat("x"))
		expectError(t, r, http.StatusBadGateway, apierr.CodeUpstreamError, true)
		if !strings.Contains(string(r.body), "A handler of the route failed") {
			t.Fatalf("the answer does not say a handler failed: %s", r.body)
		}
	}
}

func TestAfterModeKeyStaysClaimedForTheWholeCall(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "idempotency {\n lease 1s\n}\nasync {\n mode after 2500ms\n timeout 30s\n}")
	first := make(chan result, 1)
	go func() { first <- g.post(chatPath, "k", chat("x"), "X-Mock-Latency", "4s") }()
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	time.Sleep(1500 * time.Millisecond) // past the lease: what is being tested is a clock
	expectError(t, g.post(chatPath, "k", chat("x"), "X-Mock-Latency", "4s"), 409, apierr.CodeInProgress, true)
	if r := <-first; r.StatusCode != http.StatusAccepted {
		t.Fatalf("the first call's conversion: %v %s", r.Status, r.body)
	}
	if n := g.model.Stats().Received; n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

func TestFirstAttemptOverTheTimeoutInAfterModeIsOperationTimeout(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "async {\n mode after 300ms\n timeout 1500ms\n retries 3\n}")
	r := g.post(chatPath, "", chat("x"), "X-Mock-Latency", "10s")
	if r.StatusCode != http.StatusAccepted {
		t.Fatalf("not converted: %v %s", r.Status, r.body)
	}
	op := g.await(t, decodeOp(t, r).OperationID)
	if op.Status != "failed" || op.Error == nil || op.Error.Code != string(apierr.CodeOperationTimeout) {
		t.Fatalf("operation ended %s %+v, want failed with OPERATION_TIMEOUT", op.Status, op.Error)
	}
	if n := g.model.Stats().Received; n != 1 || op.Attempts != 1 {
		t.Fatalf("the timed-out call was retried: upstream ran %d times, %d attempts", n, op.Attempts)
	}
}

func TestAfterModeCallsAreBoundedByConcurrency(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "async {\n mode after 100ms\n concurrency 1\n}")
	for i := range 4 {
		r := g.post(chatPath, fmt.Sprintf("k%d", i), chat("x"), "X-Mock-Latency", "20s")
		if r.StatusCode != http.StatusAccepted {
			t.Fatalf("request %d: %v %s", i, r.Status, r.body)
		}
	}
	// One call converted after its window, one queued operation in the pool's one slot.
	if n := g.model.Stats().InFlight; n > 2 {
		t.Fatalf("%d upstream calls run at once with concurrency 1", n)
	}
}

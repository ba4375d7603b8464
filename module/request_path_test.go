package module

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// halfThenWhole is an upstream that, on its first call, promises 1000 bytes, sends 500 and drops
// the connection (a model server dying mid-answer); later calls answer whole.
type halfThenWhole struct{ calls atomic.Int64 }

func (u *halfThenWhole) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", "1000")
	if u.calls.Add(1) > 1 {
		_, _ = w.Write(bytes.Repeat([]byte("w"), 1000))
		return
	}
	_, _ = w.Write(bytes.Repeat([]byte("h"), 500))
	http.NewResponseController(w).Flush()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

func TestUpstreamDyingMidAnswerFreesTheKeyAtOnce(t *testing.T) {
	up := new(halfThenWhole)
	g := startGatewayBefore(t, up, "log {\n level ERROR\n }", "")
	first := g.post(chatPath, "k", chat("x"))
	if first.err == nil && first.StatusCode == 200 && len(first.body) == 1000 {
		t.Fatalf("the half answer reached the client as a whole one")
	}
	t.Logf("first attempt: err=%v", first.err)
	second := g.post(chatPath, "k", chat("x"))
	if second.err != nil || second.StatusCode != 200 || second.Header.Get(headerReplayed) != "" || !bytes.Equal(second.body, bytes.Repeat([]byte("w"), 1000)) {
		t.Fatalf("the retry did not run again: %v %v replayed=%q %.100s", second.err, second.Status, second.Header.Get(headerReplayed), second.body)
	}
	third := g.post(chatPath, "k", chat("x"))
	if third.Header.Get(headerReplayed) != "true" || !bytes.Equal(third.body, second.body) {
		t.Fatalf("the whole answer was not recorded: %v %.100s", third.Status, third.body)
	}
	if n := up.calls.Load(); n != 2 {
		t.Fatalf("upstream ran %d times, want 2", n)
	}
}

func TestReplayWindowStartsWhenTheResponseIsRecorded(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "idempotency {\n ttl 2s\n}")
	first := g.post(chatPath, "k", chat("x"), "X-Mock-Latency", "2500ms")
	if first.StatusCode != 200 {
		t.Fatalf("first: %v %s", first.Status, first.body)
	}
	exp, err := http.ParseTime(first.Header.Get(headerExpires))
	if err != nil || exp.Before(time.Now().Truncate(time.Second)) {
		t.Fatalf("Idempotency-Expires %q is already past (%v)", first.Header.Get(headerExpires), err)
	}
	second := g.post(chatPath, "k", chat("x"), "X-Mock-Latency", "2500ms")
	if second.Header.Get(headerReplayed) != "true" {
		t.Fatalf("a ttl shorter than the call expired at once: %v replayed=%q", second.Status, second.Header.Get(headerReplayed))
	}
}

func TestIdempotencyExpiresOnlyOnRecordedAnswers(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "async {\n max_result 4KiB\n mode after 5s\n}")
	for _, tc := range []struct {
		name     string
		headers  []string
		recorded bool
	}{
		{"a recorded answer in the window", nil, true},
		{"a 503 that is not recorded", []string{"X-Mock-Status", "503"}, false},
	} {
		r := g.post(chatPath, "k-"+tc.name, chat("x"), tc.headers...)
		if got := r.Header.Get(headerExpires) != ""; got != tc.recorded {
			t.Errorf("%s: %v with Idempotency-Expires %q", tc.name, r.Status, r.Header.Get(headerExpires))
		}
	}
	g2 := startGateway(t, modelserver.Config{}, "async {\n max_result 4KiB\n}")
	big := g2.post(chatPath, "big", chat("x"), "X-Mock-Body-Bytes", "10000")
	if big.StatusCode != 200 || big.Header.Get(headerExpires) != "" {
		t.Fatalf("an answer over max_result (not recorded) carried Idempotency-Expires %q", big.Header.Get(headerExpires))
	}
}

// rawRequest sends text over a new connection and reads one response.
func rawRequest(t *testing.T, addr, text string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(conn, text); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestUnreadableBodyIsRejectedInTheErrorSchema(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	resp, body := rawRequest(t, strings.TrimPrefix(g.base, "http://"), "POST "+chatPath+" HTTP/1.1\r\nHost: 127.0.0.1\r\n"+
		"Idempotency-Key: k\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
	expectError(t, result{Response: resp, body: body}, 400, CodeInvalidRequest, false)
	if n := g.model.Stats().Received; n != 0 {
		t.Fatalf("the unreadable request reached the upstream %d times", n)
	}
}

func TestAnswersWithinTheWindowThatAreNotWholeFailInTheErrorSchema(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "async {\n mode after 10s\n max_result 1KiB\n}")
	for _, tc := range []struct {
		name      string
		key       string
		headers   []string
		status    int
		code      ErrorCode
		retryable bool
	}{
		{"an answer over max_result", "big", []string{"X-Mock-Body-Bytes", "4096"}, 502, CodeResultTooLarge, false},
		{"a keyless answer over max_result", "", []string{"X-Mock-Body-Bytes", "4096"}, 502, CodeResultTooLarge, false},
		{"a dropped connection", "drop", []string{"X-Mock-Fail", "drop"}, 502, CodeUpstreamUnavailable, true},
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
	expectError(t, r, http.StatusGatewayTimeout, CodeOperationTimeout, true)
	if !strings.Contains(string(r.body), "within the async timeout") {
		t.Fatalf("the timeout does not say so: %s", r.body)
	}
}

func TestPanickingHandlerWithinTheWindowIsUpstreamError(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "async {\n mode after 10s\n}")
	cf := strings.Replace(string(g.config("async {\n mode after 10s\n}")), `{"handler":"reverse_proxy"`, `{"handler":"mulligan_test_panic"},{"handler":"reverse_proxy"`, 1)
	if err := caddy.Load([]byte(cf), true); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"panics", "panics", ""} { // the key is released: its retry runs again
		r := g.post(chatPath, key, chat("x"))
		// The first request may meet the old config's closing listener (a reset, never served).
		for try := 0; r.err != nil && try < 20; try++ {
			time.Sleep(50 * time.Millisecond)
			r = g.post(chatPath, key, chat("x"))
		}
		expectError(t, r, http.StatusBadGateway, CodeUpstreamError, true)
		if !strings.Contains(string(r.body), "A handler of the route failed") {
			t.Fatalf("the answer does not say a handler failed: %s", r.body)
		}
	}
}

func TestAfterModeKeyStaysClaimedForTheWholeCall(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "idempotency {\n lease 1s\n}\nasync {\n mode after 2500ms\n timeout 30s\n}")
	first := make(chan result, 1)
	go func() { first <- g.post(chatPath, "k", chat("x"), "X-Mock-Latency", "4s") }()
	waitFor(t, func() bool { return g.model.Stats().InFlight == 1 })
	time.Sleep(1500 * time.Millisecond) // past the lease: what is being tested is a clock
	expectError(t, g.post(chatPath, "k", chat("x"), "X-Mock-Latency", "4s"), 409, CodeInProgress, true)
	if r := <-first; r.StatusCode != http.StatusAccepted {
		t.Fatalf("the first call's conversion: %v %s", r.Status, r.body)
	}
	if n := g.model.Stats().Received; n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

func TestFirstAttemptOverTheTimeoutInAfterModeIsOperationTimeout(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "async {\n mode after 300ms\n timeout 1500ms\n retries 3\n}")
	r := g.post(chatPath, "", chat("x"), "X-Mock-Latency", "10s")
	if r.StatusCode != http.StatusAccepted {
		t.Fatalf("not converted: %v %s", r.Status, r.body)
	}
	op := g.await(t, decodeOp(t, r).OperationID)
	if op.Status != "failed" || op.Error == nil || op.Error.Code != string(CodeOperationTimeout) {
		t.Fatalf("operation ended %s %+v, want failed with OPERATION_TIMEOUT", op.Status, op.Error)
	}
	if n := g.model.Stats().Received; n != 1 || op.Attempts != 1 {
		t.Fatalf("the timed-out call was retried: upstream ran %d times, %d attempts", n, op.Attempts)
	}
}

func TestAfterModeCallsAreBoundedByConcurrency(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "async {\n mode after 100ms\n concurrency 1\n}")
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

func TestTenantsAreKeptApartByDefault(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	alice, bob := []string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}
	a := g.post(chatPath, "shared", chat("alice's prompt"), alice...)
	_, op := g.submit(t, "op-key", alice...)
	g.await(t, op.OperationID, alice...)

	b := g.post(chatPath, "shared", chat("alice's prompt"), bob...)
	if b.StatusCode != 200 || b.Header.Get(headerReplayed) != "" || bytes.Equal(a.body, b.body) {
		t.Fatalf("bob got alice's replay: %v replayed=%q", b.Status, b.Header.Get(headerReplayed))
	}
	for _, r := range []result{
		g.get("/v1/operations/"+op.OperationID, bob...),
		g.get("/v1/operations/"+op.OperationID+"/result", bob...),
		g.post("/v1/operations/"+op.OperationID+"/cancel", "", "", bob...),
	} {
		expectError(t, r, 404, CodeOperationNotFound, false)
	}
	for name, who := range map[string][]string{"bob": bob, "an anonymous caller": nil} {
		list := g.get("/v1/operations", who...)
		if list.StatusCode != 200 || bytes.Contains(list.body, []byte(op.OperationID)) {
			t.Fatalf("%s listed alice's operation: %v %s", name, list.Status, list.body)
		}
	}
	_, anon := g.submit(t, "anon-key")
	if list := g.get("/v1/operations"); bytes.Contains(list.body, []byte(anon.OperationID)) {
		t.Fatalf("callers without credentials list each other's operations: %s", list.body)
	}
	if list := g.get("/v1/operations", alice...); !bytes.Contains(list.body, []byte(op.OperationID)) {
		t.Fatalf("alice does not see her own operation: %s", list.body)
	}
}

func TestSharedScopeIsAnExplicitChoice(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "scope shared")
	a := g.post(chatPath, "k", chat("x"), "Authorization", "Bearer alice")
	b := g.post(chatPath, "k", chat("x"), "Authorization", "Bearer bob")
	if b.Header.Get(headerReplayed) != "true" || !bytes.Equal(a.body, b.body) {
		t.Fatalf("scope shared did not share: replayed=%q", b.Header.Get(headerReplayed))
	}
}

func TestBodiesOverMaxBufferedGet503(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "idempotency {\n max_body 600KiB\n max_buffered 1MiB\n}")
	body := `{"pad":"` + strings.Repeat("x", 600<<10-10) + `"}`
	// A request whose upstream call is under way holds its body's share of the budget.
	held := make(chan result, 1)
	go func() { held <- g.post(chatPath, "held", body, "X-Mock-Latency", "3s") }()
	waitFor(t, func() bool { return g.model.Stats().InFlight == 1 })
	busy := g.post(chatPath, "busy", body)
	expectError(t, busy, 503, CodeBusy, true)
	if r := <-held; r.err != nil || r.StatusCode != 200 {
		t.Fatalf("the held request: %v %v", r.err, r.Status)
	}
	if r := g.post(chatPath, "busy", body); r.StatusCode != 200 {
		t.Fatalf("the budget was not given back: %v %.200s", r.Status, r.body)
	}
}

// A body counts against max_buffered as its bytes arrive, not as its Content-Length promises:
// a client that announces a large body and sends none of it holds almost nothing, so idle
// connections cannot keep everyone else at 503 GATEWAY_BUSY.
func TestStalledBodyHoldsOnlyTheBytesItSent(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "idempotency {\n max_body 600KiB\n max_buffered 1MiB\n}")
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: stalled\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n", chatPath, 600<<10)
	// net/http says 100 Continue when the handler first reads the body: it is now reading.
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.Contains(line, "100") {
		t.Fatalf("no 100 Continue: %q %v", line, err)
	}
	fmt.Fprint(conn, "{")
	body := `{"pad":"` + strings.Repeat("x", 500<<10) + `"}`
	for i := range 3 {
		if r := g.post(chatPath, fmt.Sprintf("k%d", i), body); r.err != nil || r.StatusCode != 200 {
			t.Fatalf("a body while another connection stalls: %v %v %.200s", r.err, r.Status, r.body)
		}
	}
}

// A body of exactly max_body fits a max_buffered of max_body, with or without Content-Length:
// otherwise it would get a retryable 503 GATEWAY_BUSY that no retry can pass.
func TestBodyOfMaxBodyFitsAMaxBufferedOfMaxBody(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "idempotency {\n max_body 64KiB\n max_buffered 64KiB\n}")
	body := `{"pad":"` + strings.Repeat("x", 64<<10-10) + `"}`
	for _, tc := range []struct {
		name string
		body io.Reader
	}{
		{"with Content-Length", strings.NewReader(body)},
		{"chunked", io.MultiReader(strings.NewReader(body))}, // no length known: sent chunked
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", g.base+chatPath, tc.body)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", tc.name)
			if r := g.do(req); r.err != nil || r.StatusCode != 200 {
				t.Fatalf("a body of max_body: %v %v %.200s", r.err, r.Status, r.body)
			}
		})
	}
	expectError(t, g.post(chatPath, "over", body+" "), 413, CodeRequestTooLarge, false)
}

func TestRecordedStreamSaysWhenItExpiresInATrailer(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "async {\n max_result 2KiB\n}")
	for _, tc := range []struct {
		name, key, content string
		recorded           bool
	}{
		{"a recorded stream", "short", "one two three", true},
		{"a stream over max_result", "long", strings.Repeat("word ", 600), false},
	} {
		req, _ := http.NewRequest("POST", g.base+chatPath, strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"`+tc.content+`"}]}`))
		req.Header.Set("Idempotency-Key", tc.key)
		req.Header.Set("Content-Type", "application/json")
		r := g.do(req)
		if r.err != nil || r.StatusCode != 200 || r.Header.Get(headerExpires) != "" {
			t.Fatalf("%s: %v %v, header Idempotency-Expires %q", tc.name, r.err, r.Status, r.Header.Get(headerExpires))
		}
		if got := r.Trailer.Get(headerExpires) != ""; got != tc.recorded {
			t.Errorf("%s: trailer Idempotency-Expires %q, want it %v", tc.name, r.Trailer.Get(headerExpires), tc.recorded)
		}
	}
}

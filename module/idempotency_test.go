package module

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

func TestRetriedRequestReplaysTheFirstResponseByteForByte(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 10 * time.Millisecond}, "")
	first := g.post(chatPath, "key-1", chat("hello"))
	if first.err != nil || first.StatusCode != 200 {
		t.Fatalf("first: %v %v %s", first.err, first.Status, first.body)
	}
	if first.Header.Get(headerReplayed) != "" || first.Header.Get(headerExpires) == "" {
		t.Fatalf("first response headers: %v", first.Header)
	}
	second := g.post(chatPath, "key-1", chat("hello"))
	if second.StatusCode != 200 || !bytes.Equal(first.body, second.body) {
		t.Fatalf("replay differs:\n%s\n%s", first.body, second.body)
	}
	if second.Header.Get(headerReplayed) != "true" {
		t.Fatal("replay not marked Idempotent-Replayed: true")
	}
	exp, err := http.ParseTime(second.Header.Get(headerExpires))
	if err != nil || exp.Before(time.Now().Add(23*time.Hour)) {
		t.Fatalf("Idempotency-Expires %q: %v", second.Header.Get(headerExpires), err)
	}
	for _, h := range []string{"Content-Type", modelserver.HeaderExecutionID} {
		if first.Header.Get(h) != second.Header.Get(h) {
			t.Errorf("header %s: %q then %q", h, first.Header.Get(h), second.Header.Get(h))
		}
	}
	if second.Header.Get(headerRequestID) == first.Header.Get(headerRequestID) {
		t.Error("the replay kept the first request's X-Request-Id")
	}
	if n := g.model.Stats().Received; n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

func TestQuotedKeyIsTheSameKey(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "")
	g.post(chatPath, "abc", chat("x"))
	r := g.post(chatPath, `"abc"`, chat("x"))
	if r.Header.Get(headerReplayed) != "true" {
		t.Fatalf("the RFC 8941 quoted key did not replay: %d %s", r.StatusCode, r.body)
	}
}

func TestInvalidKeysAreRejected(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "")
	for _, key := range []string{strings.Repeat("k", 256), `"open`, "caf\u00e9"} {
		expectError(t, g.post(chatPath, key, chat("x")), 400, apierr.CodeKeyInvalid, false)
	}
	if n := g.model.Stats().Received; n != 0 {
		t.Fatalf("an invalid key reached the upstream %d times", n)
	}
}

func TestRequiredKeyIsEnforcedOnCoveredMethodsOnly(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "idempotency {\n required\n}")
	expectError(t, g.post(chatPath, "", chat("x")), 400, apierr.CodeKeyRequired, false)
	req, _ := http.NewRequest("GET", g.base+"/healthz", nil)
	if r := g.do(req); r.StatusCode != 200 {
		t.Fatalf("GET without a key: %d", r.StatusCode)
	}
}

func TestKeylessRequestsPassThroughWhenOptional(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "")
	g.post(chatPath, "", chat("x"))
	g.post(chatPath, "", chat("x"))
	if n := g.model.Stats().Received; n != 2 {
		t.Fatalf("keyless requests ran %d times, want 2", n)
	}
}

func TestDuplicateWithDifferentBodyIsRejected(t *testing.T) {
	t.Parallel()
	for _, status := range []int{409, 422} {
		g := startHandler(t, modelserver.Config{}, "idempotency {\n mismatch_status "+itoa(status)+"\n}")
		g.post(chatPath, "k", chat("one"))
		expectError(t, g.post(chatPath, "k", chat("two")), status, apierr.CodeKeyReused, false)
		if n := g.model.Stats().Received; n != 1 {
			t.Fatalf("upstream ran %d times", n)
		}
		_ = g
	}
}

func TestFingerprintIgnoreMakesVolatileFieldsNotCount(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "idempotency {\n fingerprint_ignore /metadata/request_id\n}")
	g.post(chatPath, "k", `{"messages":[{"role":"user","content":"x"}],"metadata":{"request_id":"a"}}`)
	r := g.post(chatPath, "k", `{"metadata":{"request_id":"b"},"messages":[{"content":"x","role":"user"}]}`)
	if r.Header.Get(headerReplayed) != "true" {
		t.Fatalf("not replayed: %d %s", r.StatusCode, r.body)
	}
}

func TestScopesNeverSeeEachOthersResponses(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "scope {http.request.header.Authorization}")
	a := g.post(chatPath, "shared", chat("alice's prompt"), "Authorization", "Bearer alice")
	b := g.post(chatPath, "shared", chat("bob's prompt"), "Authorization", "Bearer bob")
	if b.StatusCode != 200 || b.Header.Get(headerReplayed) != "" || bytes.Equal(a.body, b.body) {
		t.Fatalf("bob got %d replayed=%q", b.StatusCode, b.Header.Get(headerReplayed))
	}
	if a2 := g.post(chatPath, "shared", chat("alice's prompt"), "Authorization", "Bearer alice"); !bytes.Equal(a.body, a2.body) {
		t.Fatal("alice's replay changed")
	}
	if n := g.model.Stats().Received; n != 2 {
		t.Fatalf("upstream ran %d times, want 2", n)
	}
}

func TestInFlightDuplicateGets409WithRetryAfter(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: time.Second}, "")
	done := make(chan result)
	go func() { done <- g.post(chatPath, "k", chat("slow")) }()
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	r := g.post(chatPath, "k", chat("slow"))
	expectError(t, r, 409, apierr.CodeInProgress, true)
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	if first := <-done; first.StatusCode != 200 {
		t.Fatalf("first: %d", first.StatusCode)
	}
}

func TestWaitInflightDuplicateGetsTheReplay(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 300 * time.Millisecond}, "idempotency {\n wait_inflight 5s\n}")
	done := make(chan result)
	go func() { done <- g.post(chatPath, "k", chat("slow")) }()
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	r := g.post(chatPath, "k", chat("slow"))
	first := <-done
	if r.StatusCode != 200 || r.Header.Get(headerReplayed) != "true" || !bytes.Equal(r.body, first.body) {
		t.Fatalf("waiting duplicate got %d %s", r.StatusCode, r.body)
	}
}

func TestUnrecordedOutcomesReleaseTheKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, block string
		headers     []string
		wantRuns    int64
	}{
		{"503 is retried", "", []string{"X-Mock-Status", "503"}, 2},
		{"429 is retried", "", []string{"X-Mock-Status", "429"}, 2},
		{"408 is retried", "", []string{"X-Mock-Status", "408"}, 2},
		{"a dropped connection is retried", "", []string{"X-Mock-Fail", "drop"}, 2},
		{"404 is recorded", "", []string{"X-Mock-Status", "404"}, 1},
		{"4xx is not recorded when store_status says 2xx", "idempotency {\n store_status 2xx\n}", []string{"X-Mock-Status", "404"}, 2},
		{"an explicit 503 is recorded", "idempotency {\n store_status 2xx 503\n}", []string{"X-Mock-Status", "503"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := startHandler(t, modelserver.Config{}, tc.block)
			g.post(chatPath, "k", chat("x"), tc.headers...)
			second := g.post(chatPath, "k", chat("x"), tc.headers...)
			if n := g.model.Stats().Received; n != tc.wantRuns {
				t.Fatalf("upstream ran %d times, want %d (second: %d %s)", n, tc.wantRuns, second.StatusCode, second.body)
			}
		})
	}
}

func TestKeyedRequestOutlivesItsClient(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 500 * time.Millisecond}, "idempotency {\n wait_inflight 5s\n}")
	// The impatient client gives up once the upstream has its call, whatever the machine's load.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for deadline := time.Now().Add(10 * time.Second); g.model.Stats().InFlight == 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	req, _ := http.NewRequestWithContext(ctx, "POST", g.base+chatPath, strings.NewReader(chat("x")))
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("Content-Type", "application/json")
	if _, err := g.client.Do(req); err == nil {
		t.Fatal("the impatient client did not give up")
	}
	r := g.post(chatPath, "k", chat("x")) // the SDK's retry
	if r.StatusCode != 200 || r.Header.Get(headerReplayed) != "true" {
		t.Fatalf("retry got %d replayed=%q", r.StatusCode, r.Header.Get(headerReplayed))
	}
	s := g.model.Stats()
	if s.Received != 1 || s.Abandoned != 0 {
		t.Fatalf("upstream stats %+v: want one execution, none abandoned", s)
	}
}

func TestOversizedBodyIs413AndBodiesReachUpstreamIntact(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "idempotency {\n max_body 1KiB\n}")
	expectError(t, g.post(chatPath, "k", chat(strings.Repeat("x", 2000))), 413, apierr.CodeRequestTooLarge, false)
	r := g.post(chatPath, "k2", chat("intact body"))
	if r.StatusCode != 200 || !bytes.Contains(r.body, []byte("intact body")) && !bytes.Contains(r.body, []byte("ydob tcatni")) {
		t.Fatalf("the upstream did not get the body: %s", r.body)
	}
	if n := g.model.Stats().Received; n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

func TestStreamedResponseStreamsAndReplays(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{ChunkDelay: 100 * time.Millisecond}, "")
	body := `{"stream":true,"messages":[{"role":"user","content":"one two three four"}]}`
	req, _ := http.NewRequest("POST", g.base+chatPath, strings.NewReader(body))
	req.Header.Set("Idempotency-Key", "s")
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "id: ") { // every relayed event carries an id (docs/streams.md)
		t.Fatalf("first line %q: %v", line, err)
	}
	if g.model.Stats().InFlight != 1 {
		t.Fatal("the first event arrived only after the upstream finished: the stream was buffered")
	}
	var all bytes.Buffer
	all.WriteString(line)
	_, _ = all.ReadFrom(rd)
	resp.Body.Close()
	rep := g.post(chatPath, "s", body)
	if rep.Header.Get(headerReplayed) != "true" || !bytes.Equal(rep.body, all.Bytes()) {
		t.Fatalf("stream replay differs:\n%q\n%q", all.Bytes(), rep.body)
	}
}

func TestResponseOverTheRecordLimitIsNotReplayable(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "async {\n max_result 4KiB\n}")
	big := g.post(chatPath, "k", chat("x"), "X-Mock-Body-Bytes", "10000")
	if big.StatusCode != 200 || len(big.body) < 10000 {
		t.Fatalf("the client did not get the whole large response: %d bytes", len(big.body))
	}
	g.post(chatPath, "k", chat("x"), "X-Mock-Body-Bytes", "10000")
	if n := g.model.Stats().Received; n != 2 {
		t.Fatalf("upstream ran %d times, want 2 (the key must be released)", n)
	}
}

func TestEveryResponseCarriesARequestID(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "")
	r := g.post(chatPath, "", chat("x"))
	if !strings.HasPrefix(r.Header.Get(headerRequestID), "srv_req_") {
		t.Fatalf("generated X-Request-Id %q", r.Header.Get(headerRequestID))
	}
	r = g.post(chatPath, "k", chat("x"), headerRequestID, "client-123")
	if r.Header.Get(headerRequestID) != "client-123" {
		t.Fatalf("X-Request-Id not echoed: %q", r.Header.Get(headerRequestID))
	}
	r = g.post(chatPath, "k", chat("x"), headerRequestID, "client-456")
	if r.Header.Get(headerRequestID) != "client-456" || r.Header.Get(headerReplayed) != "true" {
		t.Fatalf("replay X-Request-Id %q", r.Header.Get(headerRequestID))
	}
}

func TestStorageFailureAnswers503(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	g.post(chatPath, "k", chat("x"))
	g.closeStorages() // the database goes away under the running config
	expectError(t, g.post(chatPath, "k", chat("x")), 503, apierr.CodeStorage, true)
}

func itoa(n int) string { return strconv.Itoa(n) }

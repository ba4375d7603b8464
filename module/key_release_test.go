package module

import (
	"bytes"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

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
	g := startGatewayBefore(t, up, quietGlobals, "")
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
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "idempotency {\n ttl 2s\n}")
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

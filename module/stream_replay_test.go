package module

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// flakyReads is a Badger store whose next ReadEvents fails (a dropped connection, a timeout).
type flakyReads struct {
	*badger.Store
	fail atomic.Int32
}

func (f *flakyReads) ReadEvents(key []byte, after uint64, limit int) (store.StreamPage, error) {
	if f.fail.Add(-1) >= 0 {
		return store.StreamPage{}, errors.New("transient: connection reset")
	}
	return f.Store.ReadEvents(key, after, limit)
}

// openBadger opens a Badger store on a temporary directory, closed when t ends.
func openBadger(t *testing.T) *badger.Store {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func bareGate(t *testing.T) *gate {
	policy, err := parseStatusPolicy([]string{"2xx", "4xx"})
	if err != nil {
		t.Fatal(err)
	}
	return (&gate{header: "Idempotency-Key", ttl: time.Hour, lease: time.Minute, maxResult: 1 << 20, policy: policy,
		clock: realClock}).withStreams()
}

// A retry of a finished, recorded stream whose recording cannot be read at that moment (one
// failed read) must not be answered with the record's empty body as if it were the stream.
func TestStreamedReplayIsNeverEmptyWhenItsEventsCannotBeRead(t *testing.T) {
	st := openBadger(t)
	fs := &flakyReads{Store: st}
	key, fp := []byte("rk"), []byte("fp")
	c, err := st.ClaimKey(key, fp, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.BeginStream(key, store.KeyHolder(c.Token), 200, http.Header{"Content-Type": {"text/event-stream"}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	_ = st.AppendEvents(key, store.KeyHolder(c.Token), []store.StreamEvent{{ID: "1", Data: []byte("id: 1\ndata: hello\n\n")}})
	if err := st.FinishStream(key, store.KeyHolder(c.Token), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	g := bareGate(t)
	fs.fail.Store(1)
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"stream":true}`))
	kr := &keyedRequest{r: r, key: "k", recordKey: key, fp: fp, body: []byte(`{"stream":true}`), log: newReqLog(zap.NewNop())}
	w := httptest.NewRecorder()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { t.Error("upstream called"); return nil })
	_ = g.claimAndRun(w, kr, next, fs)
	t.Logf("status %d, replayed %q, content-type %q, body %q", w.Code, w.Header().Get(headerReplayed), w.Header().Get("Content-Type"), w.Body.String())
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), string(apierr.CodeStorage)) {
		t.Fatalf("a recorded stream that could not be read was answered %d %q replayed=%q, want 503 %s", w.Code, w.Body.String(), w.Header().Get(headerReplayed), apierr.CodeStorage)
	}
}

// A keyed stream, finished and recorded, retried with Prefer: respond-async (same key, same
// body, so the same fingerprint): the record's answer is the recorded stream, not its empty body.
func TestAsyncRetryOfARecordedStreamReplaysTheStream(t *testing.T) {
	up := newEventUpstream(5)
	up.release()
	g := startGatewayWith(t, gatewaySetup{upstream: up})
	if evs, err := g.openStream("k").readAll(); err != nil || len(evs) != 5 {
		t.Fatalf("first: %d events, %v", len(evs), err)
	}
	r := g.post(chatPath, "k", `{"model":"demo","stream":true,"messages":[]}`, "Prefer", "respond-async")
	t.Logf("async retry: %d %q replayed=%q body=%q", r.StatusCode, r.Header.Get("Content-Type"), r.Header.Get(headerReplayed), r.body)
	if r.StatusCode != 200 || r.Header.Get(headerReplayed) != "true" || strings.Count(string(r.body), "data: ") != 5 {
		t.Fatalf("the async retry of a recorded stream did not get the stream: %d %q", r.StatusCode, r.body)
	}
}

package module

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// A keyed call's upstream is called while its claim's fsync runs, and the client gets no byte
// of the answer, its status line included, before that fsync is done (docs/api.md,
// "Durability"). The test holds every group fsync of the gateway's Badger in the syncer's
// observer (which runs after the fsync, before its writers are released) until the upstream
// has sent its first event, and checks that the client's headers came only after the release.
func TestKeyedStreamReachesTheClientOnlyOnceItsClaimIsDurable(t *testing.T) {
	called, flushed, finish := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if runs.Add(1) == 1 {
			close(called)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: first\n\n")
		http.NewResponseController(w).Flush()
		if runs.Load() == 1 {
			close(flushed)
			<-finish
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	g := startGatewayBefore(t, up, quietGlobals, "")
	st, err := badger.Open(badger.Options{Dir: g.dir + "/badger"}) // the gateway's own database, shared
	if err != nil {
		t.Fatal(err)
	}
	var hold, released atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	var heldOnce, releaseOnce sync.Once
	st.SetSyncObserver(func(int) {
		if hold.Load() {
			heldOnce.Do(func() { close(held) })
			<-release
		}
	})
	let := func() { releaseOnce.Do(func() { released.Store(true); close(release) }) }
	t.Cleanup(func() { let(); _ = st.Close() })
	var finishOnce sync.Once
	t.Cleanup(func() { finishOnce.Do(func() { close(finish) }) })

	type answer struct {
		resp         *http.Response
		err          error
		afterRelease bool
	}
	answers := make(chan answer, 1)
	hold.Store(true)
	go func() {
		req, _ := http.NewRequest("POST", g.base+chatPath, strings.NewReader(`{"model":"demo","stream":true,"messages":[]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "overlap")
		resp, err := g.client.Do(req)
		answers <- answer{resp: resp, err: err, afterRelease: released.Load()}
	}()
	testkit.WaitFor(t, 20*time.Second, "the claim's fsync held", func() bool { return isClosed(held) })
	testkit.WaitFor(t, 20*time.Second, "the upstream called while the claim's fsync is held", func() bool { return isClosed(flushed) })
	let()
	a := <-answers
	if a.err != nil {
		t.Fatal(a.err)
	}
	defer a.resp.Body.Close()
	if !a.afterRelease {
		t.Fatalf("the client had the answer's headers (%v) before its claim's fsync was done", a.resp.Status)
	}
	finishOnce.Do(func() { close(finish) })
	body, err := io.ReadAll(a.resp.Body)
	if err != nil || a.resp.StatusCode != 200 || !strings.Contains(string(body), "data: first") {
		t.Fatalf("answer %v, %v: %q", a.resp.Status, err, body)
	}
	replay := g.post(chatPath, "overlap", `{"model":"demo","stream":true,"messages":[]}`)
	if replay.StatusCode != 200 || replay.Header.Get(headerReplayed) != "true" || !strings.Contains(string(replay.body), "data: first") {
		t.Fatalf("the recorded stream did not replay: %v replayed=%q %q", replay.Status, replay.Header.Get(headerReplayed), replay.body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

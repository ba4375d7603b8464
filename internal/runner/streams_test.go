package runner

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/reqlog"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// After a takeover (the replica that ran attempt 1 lost the operation mid-stream), the
// operation runs again under another holder whose answer has not begun. Attempt 1's recording is
// still in the store, marked live. A follower or a progress read on a third replica must not be
// given the dead attempt's events as the running attempt's.
func TestStoredFollowerIgnoresTheRecordingOfADeadAttempt(t *testing.T) {
	st := storeWithQueuedOperation(t, "op_1")
	stream := []byte("op_1")
	// Attempt 1 (replica H1) recorded 5 events under the operation's stream, then lost it.
	if running, err := st.ClaimNext("H1", time.Minute); err != nil || running == nil {
		t.Fatalf("claim by H1: %+v %v", running, err)
	}
	h1 := store.OperationHolder("H1")
	if err := st.BeginStream(stream, h1, 200, http.Header{"Content-Type": {"text/event-stream"}}, 11*time.Minute); err != nil {
		t.Fatal(err)
	}
	var evs []store.StreamEvent
	for i := 1; i <= 5; i++ {
		evs = append(evs, store.StreamEvent{ID: fmt.Sprint(i), Data: []byte(fmt.Sprintf("id: %d\ndata: old %d\n\n", i, i))})
	}
	if err := st.AppendEvents(stream, h1, evs); err != nil {
		t.Fatal(err)
	}
	// The operation now runs under H2; H2's attempt has not answered yet.
	if _, err := st.Transition("op_1", store.Change{To: store.StatusQueued, Holder: "H1"}); err != nil {
		t.Fatal(err)
	}
	running, err := st.ClaimNext("H2", time.Minute)
	if err != nil || running == nil || running.Holder != "H2" {
		t.Fatalf("claim by H2: %+v %v", running, err)
	}
	r := &Runner{st: st, shared: st}
	if events, bytes, ok := r.StoredProgress(running); ok {
		t.Errorf("progress of H2's attempt reads the dead attempt's: %d events, %d bytes", events, bytes)
	}
	if f, _ := r.FollowStored(running); f != nil {
		got, _, _, _ := f.Next(0)
		t.Errorf("a follower of H2's attempt is given the dead attempt's %d events", len(got))
	}
	// Once H2's answer begins, its own recording replaces H1's and is followed.
	h2 := store.OperationHolder("H2")
	if err := st.BeginStream(stream, h2, 200, http.Header{"Content-Type": {"text/event-stream"}}, 11*time.Minute); err != nil {
		t.Fatal(err)
	}
	_ = st.AppendEvents(stream, h2, evs[:2])
	if events, _, ok := r.StoredProgress(running); !ok || events != 2 {
		t.Errorf("progress of H2's own recording: %d events, %v", events, ok)
	}
	if f, page := r.FollowStored(running); f == nil || page.Token != h2.Token {
		t.Errorf("H2's own recording is not followed: %+v", page)
	}
}

// A replica that lost an operation to a takeover but does not know yet (its lease renewal has
// not answered) may still begin recording its attempt's answer. It must not wipe the recording
// of the attempt now running under the operation's current holder.
func TestStaleHolderDoesNotWipeTheCurrentHoldersRecording(t *testing.T) {
	st := storeWithQueuedOperation(t, "op_1")
	if running, err := st.ClaimNext("H2", time.Minute); err != nil || running == nil {
		t.Fatalf("claim: %+v %v", running, err)
	}
	header := http.Header{"Content-Type": {"text/event-stream"}}
	recording := func(worker string) *opRecording {
		return &opRecording{st: st, id: "op_1", holder: store.OperationHolder(worker), keep: time.Minute, log: reqlog.New(zap.NewNop())}
	}
	event := func(i int, who string) store.StreamEvent {
		return store.StreamEvent{ID: fmt.Sprint(i), Data: []byte(fmt.Sprintf("id: %d\ndata: %s %d\n\n", i, who, i))}
	}
	current := recording("H2") // the holder: its answer has begun
	current.Begin(200, header)
	current.Add([]store.StreamEvent{event(1, "current"), event(2, "current"), event(3, "current")})
	stale := recording("H1") // lost the operation to H2, not told yet
	stale.Begin(200, header)
	stale.Add([]store.StreamEvent{event(1, "stale")})
	if stale.live.Drain() {
		t.Error("the stale holder's recording was stored")
	}
	current.Add([]store.StreamEvent{event(4, "current")})
	if !current.live.Drain() {
		t.Fatal("the current holder's recording was cut")
	}
	page, err := st.ReadEvents([]byte("op_1"), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if page.Token != current.holder.Token || page.State != store.StreamLive || page.Events != 4 {
		t.Fatalf("the recording is %v with %d events under token %q; want the current holder's 4 under %q",
			page.State, page.Events, page.Token, current.holder.Token)
	}
}

// storeWithQueuedOperation opens a Badger store, closed when t ends, holding queued operation id.
func storeWithQueuedOperation(t *testing.T, id string) *badger.Store {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	op := &store.Operation{ID: id, Scope: "s", Status: store.StatusQueued, Version: 1, Method: "POST", Path: "/v1/x",
		SubmittedAt: time.Now(), Retention: time.Hour, Urgency: store.DefaultUrgency}
	if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
		t.Fatal(err)
	}
	return st
}

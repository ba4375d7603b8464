package module

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// heldTransitions is a real store whose Transition of an operation a dead worker held waits
// until released: a database slow to settle what a takeover finds. RenewLeases calls are
// reported as they happen.
type heldTransitions struct {
	store.Backend
	dead     string
	entered  chan struct{}
	release  chan struct{}
	renewals chan struct{}
}

func (h *heldTransitions) Transition(id string, c store.Change) (*store.Operation, error) {
	if c.Holder == h.dead {
		h.entered <- struct{}{}
		<-h.release
	}
	return h.Backend.Transition(id, c)
}

func (h *heldTransitions) RenewLeases(worker string, ids []string, lease time.Duration) (store.Renewal, error) {
	select {
	case h.renewals <- struct{}{}:
	default:
	}
	return h.Backend.RenewLeases(worker, ids, lease)
}

// While a takeover settles what a dead worker held, however slowly, the replica goes on renewing
// the leases of what it runs itself: the two do not share a goroutine.
func TestSlowTakeoverDoesNotDelayRenewals(t *testing.T) {
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var mine string
	for i, worker := range []string{"wrk_dead", "mine"} {
		// A lost operation fails WORKER_LOST rather than going back to the queue, where this
		// runner's claim loop would take it.
		op := &store.Operation{ID: newID("op_", time.Now()), Scope: "s", Status: store.StatusQueued, Version: 1,
			Method: "POST", Path: "/v1/x", SubmittedAt: time.Now(), Retention: time.Hour, Exec: &store.Execution{OnCrash: CrashFail}}
		if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
			t.Fatal(err)
		}
		lease := []time.Duration{time.Millisecond, time.Minute}[i]
		claimed, err := st.ClaimNext(worker, lease)
		if err != nil || claimed == nil || claimed.ID != op.ID {
			t.Fatalf("claim for %s: %v %v", worker, claimed, err)
		}
		mine = claimed.ID
	}
	h := &heldTransitions{Backend: st, dead: "wrk_dead", entered: make(chan struct{}, 1), release: make(chan struct{}),
		renewals: make(chan struct{}, 1)}
	r := newRunner(h, storageSpec{concurrency: 1, takeover: 300 * time.Millisecond}, realClock, zap.NewNop(), newCourier(h, realClock, zap.NewNop()))
	r.worker = "mine"
	_, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	r.running[mine] = &execution{cancel: cancel, done: make(chan struct{}), leaseUntil: time.Now().Add(time.Minute)}
	r.Start()
	defer func() { close(h.release); r.shutdown(true); r.endBeats(); r.courier.Stop() }()
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the takeover never found the dead worker's operation")
	}
	for i := range 3 {
		select {
		case <-h.renewals:
		case <-time.After(5 * time.Second):
			t.Fatalf("renewal %d did not come while a takeover was settling", i+1)
		}
	}
}

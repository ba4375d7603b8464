package runner

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mulligan-gw/mulligan/internal/clocks"
	"github.com/mulligan-gw/mulligan/internal/courier"
	"github.com/mulligan-gw/mulligan/internal/ids"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
	"github.com/mulligan-gw/mulligan/store/postgres"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
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
		op := &store.Operation{ID: ids.New("op_", time.Now()), Scope: "s", Status: store.StatusQueued, Version: 1,
			Method: "POST", Path: "/v1/x", SubmittedAt: time.Now(), Retention: time.Hour, Exec: &store.Execution{OnCrash: crashFail}}
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
	r := New(Options{Store: h, Clock: clocks.Real, Log: zap.NewNop(), Courier: courier.New(courier.Options{Store: h, Worker: "wrk_courier", Clock: clocks.Real, Log: zap.NewNop()}),
		Config: Config{Concurrency: 1, Takeover: 300 * time.Millisecond}})
	r.worker = "mine"
	_, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	r.running[mine] = &execution{cancel: cancel, done: make(chan struct{}), leaseUntil: time.Now().Add(time.Minute)}
	r.Start()
	defer func() { close(h.release); r.Shutdown(true); r.endBeats(); r.Courier().Stop() }()
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

// TestTakeoverWaitsAGracePastTheLease: a replica takes over an operation whose holder fell
// silent only a grace period after its lease ended, so the holder (which stops before its lease
// ends) has stopped, even on a clock a little behind.
func TestTakeoverWaitsAGracePastTheLease(t *testing.T) {
	const takeover = 20 * time.Second
	// A grace of 2s: no slow step of the test carries op_1within past it.
	grace := LeaseMargin(takeover)
	// The store's clock is now+offset, to claim leases that ended earlier.
	var offset time.Duration
	var mu sync.Mutex
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: pgtest.Database(t), SweepEvery: -1,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return time.Now().Add(offset) }})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	claimEndedAgo := func(id string, ago time.Duration) {
		t.Helper()
		op := &store.Operation{ID: id, Scope: "s", Status: store.StatusQueued, Version: 1, Method: "POST", Path: "/v1/x",
			SubmittedAt: time.Now(), Retention: time.Hour}
		if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		offset = -takeover - ago
		mu.Unlock()
		if got, err := st.ClaimNext("silent", takeover); err != nil || got == nil || got.ID != id {
			t.Fatalf("claim %s: %+v %v", id, got, err)
		}
		mu.Lock()
		offset = 0
		mu.Unlock()
	}
	claimEndedAgo("op_1within", grace/2)
	claimEndedAgo("op_2past", 2*grace)
	r := New(Options{Store: st, Clock: clocks.Real, Log: zap.NewNop(), Replicated: true, Config: Config{Concurrency: 1, Takeover: takeover},
		Courier: courier.New(courier.Options{Store: st, Worker: "wrk_courier", Clock: clocks.Real, Log: zap.NewNop()})})
	r.takeOver()
	for id, want := range map[string]store.Status{"op_1within": store.StatusRunning, "op_2past": store.StatusQueued} {
		op, err := st.GetOperation(id)
		if err != nil {
			t.Fatal(err)
		}
		if op.Status != want {
			t.Errorf("%s, whose lease ended %s: %s, want %s", id, map[string]string{"op_1within": "within the grace", "op_2past": "past the grace"}[id], op.Status, want)
		}
	}
}

// TestRenewalOfASettledExecutionIsNoLoss: an execution whose outcome is written reads as lost
// to the renewal that lists it in the instant before it leaves the runner. That is no lost
// lease: nothing is warned of. An execution still at its upstream work is stopped, warned of.
func TestRenewalOfASettledExecutionIsNoLoss(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lr := newLoopRunner(t, clock, answerOK, Config{})
	logs, observed := observer.New(zap.WarnLevel)
	lr.log = zap.New(logs)
	for _, id := range []string{"op_settled", "op_running"} {
		lr.Accept(t, id, testExecution(time.Minute, 0), nil, `{}`)
		if _, err := lr.st.ClaimQueued(id, lr.worker, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := lr.st.Transition(id, store.Change{To: store.StatusSucceeded, Holder: lr.worker, Result: &store.Response{Status: 200}}); err != nil {
			t.Fatal(err)
		}
	}
	_, cancelSettled := context.WithCancelCause(context.Background())
	runningCtx, cancelRunning := context.WithCancelCause(context.Background())
	settled := &execution{cancel: cancelSettled, done: make(chan struct{}), settling: true, expiry: clock.NewTimer(time.Hour)}
	running := &execution{cancel: cancelRunning, done: make(chan struct{}), expiry: clock.NewTimer(time.Hour)}
	lr.mu.Lock()
	lr.running["op_settled"], lr.running["op_running"] = settled, running
	lr.mu.Unlock()
	lr.renew(time.Minute)
	if !errors.Is(context.Cause(runningCtx), errLeaseLost) {
		t.Errorf("the execution at its upstream work: cause %v, want errLeaseLost", context.Cause(runningCtx))
	}
	warned := observed.FilterMessage("operation no longer held by this worker").All()
	if len(warned) != 1 || warned[0].ContextMap()["operation_id"] != "op_running" {
		t.Errorf("warnings %v; want one, of op_running", warned)
	}
	lr.mu.Lock()
	delete(lr.running, "op_settled")
	delete(lr.running, "op_running")
	lr.mu.Unlock()
}

// A Badger storage has one process: what its dead process was running is taken over as soon
// as the storage opens again, not once the dead process's lease would have ended
// (docs/backends.md).
func TestRestartTakesOverTheDeadProcesssOperationsAtOnce(t *testing.T) {
	const takeover = 30 * time.Second
	dir, clock := t.TempDir(), newFakeClock()
	st, err := badger.Open(badger.Options{Dir: dir, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ex := testExecution(time.Minute, 0)
	testkit.QueueChat(t, st, &store.Operation{ID: "op_1", Exec: &ex}, clock.Now(), nil, chat("cut"))
	dead, err := st.ClaimNext("wrk_dead", takeover)
	if err != nil || dead == nil {
		t.Fatalf("claim: %+v %v", dead, err)
	}
	if err := st.Close(); err != nil { // the process dies holding it
		t.Fatal(err)
	}
	up, calls, _ := gatedUpstream(clock, "")
	lr := newLoopRunnerIn(t, dir, clock, up, Config{Concurrency: 1, Takeover: takeover})
	lr.Start()
	select { // the clock stands still: only a look at Start can run it
	case call := <-calls:
		call.answer <- http.StatusOK
	case <-time.After(10 * time.Second):
		t.Fatal("not within 10s: the restarted runner did not run its dead process's operation")
	}
	if op := lr.Await(t, "op_1"); op.Status != store.StatusSucceeded || op.Attempts != 2 {
		t.Fatalf("%s after %d attempts, want succeeded after 2", op.Status, op.Attempts)
	}
}

package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

var queueTests = []test{
	{"ClaimNextTakesTheOldestQueuedFirst", testClaimNextIsFIFO},
	{"NoOperationIsClaimedTwiceUnderConcurrentWorkers", testClaimNextIsExclusive},
	{"RenewalReportsCancelRequestsAndLostOperations", testRenewLeases},
	{"ExpiredLeaseIsTakenOverAndTheLateHolderChangesNothing", testLeaseTakeover},
	{"TakeoverNeverRacesARenewal", testTakeoverAfterRenewal},
	{"RequeuedOperationIsClaimedAgain", testRequeue},
	{"CountsFollowTheQueue", testCounts},
}

func testClaimNextIsFIFO(t *testing.T, e *env) {
	b := e.open()
	if op := must(b.ClaimNext("w1", time.Minute))(t); op != nil {
		t.Fatalf("empty queue gave %s", op.ID)
	}
	e.accept(t, b, "s", 0, 4)
	must(b.Transition(opID(1), store.Change{To: store.StatusCanceled}))(t)
	var got []string
	for range 4 {
		op := must(b.ClaimNext("w1", time.Minute))(t)
		if op == nil {
			break
		}
		got = append(got, op.ID)
	}
	if want := []string{opID(0), opID(2), opID(3)}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
}

// Workers on two handles drain one queue concurrently: each operation is claimed exactly once.
func testClaimNextIsExclusive(t *testing.T, e *env) {
	handles := []store.Backend{e.open(), e.open()}
	const ops, workers = 40, 8
	e.accept(t, handles[0], "s", 0, ops)
	drainExclusively(t, handles, workers, ops)
	if queued, running := pair(handles[1].QueueStats())(t); queued != 0 || running != ops {
		t.Fatalf("queued %d running %d, want 0 and %d", queued, running, ops)
	}
}

// The holder's renewal tells it of a cancel asked through another handle, and of operations
// it no longer holds.
func testRenewLeases(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	e.accept(t, a, "s", 0, 2)
	must(a.ClaimNext("w1", time.Minute))(t)
	must(a.ClaimNext("w1", time.Minute))(t)
	r := must(a.RenewLeases("w1", []string{opID(0), opID(1)}, time.Minute))(t)
	if len(r.CancelRequested)+len(r.Lost) != 0 {
		t.Fatalf("nothing happened, renewal says %+v", r)
	}
	must(b.RequestCancel(opID(0), e.clock.Now()))(t)
	must(b.Transition(opID(1), store.Change{To: store.StatusFailed, Holder: "w1"}))(t)
	r = must(a.RenewLeases("w1", []string{opID(0), opID(1), "op_missing"}, time.Minute))(t)
	if !slices.Equal(r.CancelRequested, []string{opID(0)}) {
		t.Fatalf("cancel requested %v, want [%s]", r.CancelRequested, opID(0))
	}
	slices.Sort(r.Lost)
	if !slices.Equal(r.Lost, []string{opID(1), "op_missing"}) {
		t.Fatalf("lost %v, want [%s op_missing]", r.Lost, opID(1))
	}
	if other := must(b.RenewLeases("w2", []string{opID(0)}, time.Minute))(t); !slices.Equal(other.Lost, []string{opID(0)}) {
		t.Fatalf("another worker renewed w1's operation: %+v", other)
	}
}

// A worker that stops renewing loses its operation once its lease runs out; when it comes back
// late, it changes nothing.
func testLeaseTakeover(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	e.accept(t, a, "s", 0, 1)
	must(a.ClaimNext("w1", 30*time.Second))(t)
	e.clock.Advance(20 * time.Second)
	if exp := must(b.ExpiredLeases(10))(t); len(exp) != 0 {
		t.Fatalf("within the lease: %v expired", ids(exp))
	}
	if _, err := b.Transition(opID(0), store.Change{To: store.StatusQueued, Holder: "w1", LeaseExpired: true}); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("takeover within the lease: %v, want ErrNotHolder", err)
	}
	e.clock.Advance(11 * time.Second)
	exp := must(b.ExpiredLeases(10))(t)
	if len(exp) != 1 || exp[0].ID != opID(0) || exp[0].Holder != "w1" || exp[0].Status != store.StatusRunning {
		t.Fatalf("expired: %+v", exp)
	}
	must(b.Transition(opID(0), store.Change{To: store.StatusQueued, Holder: "w1", LeaseExpired: true}))(t)
	op := must(b.ClaimNext("w2", 30*time.Second))(t)
	if op == nil || op.ID != opID(0) || op.Holder != "w2" || op.Attempts != 2 {
		t.Fatalf("taken over: %+v", op)
	}
	if _, err := a.Transition(opID(0), store.Change{To: store.StatusSucceeded, Holder: "w1", Result: &store.Response{Status: 200}}); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("late holder: %v, want ErrNotHolder", err)
	}
	if r := must(a.RenewLeases("w1", []string{opID(0)}, time.Minute))(t); !slices.Equal(r.Lost, []string{opID(0)}) {
		t.Fatalf("late holder's renewal: %+v", r)
	}
	got := must(b.GetOperation(opID(0)))(t)
	if got.Status != store.StatusRunning || got.Holder != "w2" || got.Version != op.Version {
		t.Fatalf("the late holder changed the operation: %+v", got)
	}
	if _, err := b.LoadResult(opID(0)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the late holder's result was stored: %v", err)
	}
	must(b.Transition(opID(0), store.Change{To: store.StatusSucceeded, Holder: "w2"}))(t)
}

// A renewal that lands before the takeover keeps the operation with its holder.
func testTakeoverAfterRenewal(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	e.accept(t, a, "s", 0, 1)
	must(a.ClaimNext("w1", 30*time.Second))(t)
	e.clock.Advance(31 * time.Second)
	if exp := must(b.ExpiredLeases(10))(t); len(exp) != 1 {
		t.Fatalf("expired: %v", ids(exp))
	}
	if r := must(a.RenewLeases("w1", []string{opID(0)}, 30*time.Second))(t); len(r.Lost) != 0 {
		t.Fatalf("renewal before any takeover: %+v", r)
	}
	if _, err := b.Transition(opID(0), store.Change{To: store.StatusQueued, Holder: "w1", LeaseExpired: true}); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("takeover after the renewal: %v, want ErrNotHolder", err)
	}
	if exp := must(b.ExpiredLeases(10))(t); len(exp) != 0 {
		t.Fatalf("renewed lease listed expired: %v", ids(exp))
	}
	must(a.Transition(opID(0), store.Change{To: store.StatusSucceeded, Holder: "w1"}))(t)
}

func testRequeue(t *testing.T, e *env) {
	b := e.open()
	e.accept(t, b, "s", 0, 2)
	must(b.ClaimNext("w1", time.Minute))(t)
	op := must(b.Transition(opID(0), store.Change{To: store.StatusQueued, Holder: "w1"}))(t)
	if op.Holder != "" || !op.StartedAt.IsZero() {
		t.Fatalf("requeued: %+v", op)
	}
	if next := must(b.ClaimNext("w2", time.Minute))(t); next == nil || next.ID != opID(0) || next.Holder != "w2" {
		t.Fatalf("after requeue: %+v", next)
	}
}

func testCounts(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	e.accept(t, a, "x", 0, 3)
	e.accept(t, a, "y", 3, 1)
	must(a.ClaimNext("w1", time.Minute))(t)
	must(a.Transition(opID(1), store.Change{To: store.StatusCanceled}))(t)
	if queued, running := pair(b.QueueStats())(t); queued != 2 || running != 1 {
		t.Fatalf("queued %d running %d, want 2 and 1", queued, running)
	}
	for scope, want := range map[string]int{"x": 2, "y": 1, "z": 0} {
		if n := must(b.ActiveCount(scope))(t); n != want {
			t.Errorf("active in %s: %d, want %d", scope, n, want)
		}
	}
	must(a.Transition(opID(0), store.Change{To: store.StatusSucceeded, Holder: "w1"}))(t)
	if n := must(b.ActiveCount("x"))(t); n != 1 {
		t.Fatalf("active in x after success: %d, want 1", n)
	}
}

// drainExclusively has workers on handles (taking turns) claim until the queue is empty, and
// checks that each of the ops operations opID(0..ops-1) was claimed exactly once, by the worker
// it names as holder.
func drainExclusively(t *testing.T, handles []store.Backend, workers, ops int) {
	claims := make(chan string, ops*2)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range ops { // bounded: at most every operation
				op, err := handles[w%len(handles)].ClaimNext(fmt.Sprintf("w%d", w), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if op == nil {
					return
				}
				if op.Holder != fmt.Sprintf("w%d", w) {
					t.Errorf("%s claimed by w%d holds %q", op.ID, w, op.Holder)
				}
				claims <- op.ID
			}
		})
	}
	wg.Wait()
	close(claims)
	seen := map[string]int{}
	for id := range claims {
		seen[id]++
	}
	for i := range ops {
		if seen[opID(i)] != 1 {
			t.Errorf("%s claimed %d times", opID(i), seen[opID(i)])
		}
	}
}

package storetest

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// operationStreamTests hold an operation's recorded stream to its fence: named by the
// operation's id, written only by the worker the operation runs under (docs/streams.md).
var operationStreamTests = []test{
	{"OperationStreamIsRecordedByItsHolder", testOperationStreamIsRecordedByItsHolder},
	{"OperationStreamReadsAsAbortedOnceItsHolderLostTheOperation", testOperationStreamOfALostHolderReadsAsAborted},
	{"TakeoverFencesTheOldHoldersOperationStream", testTakeoverFencesTheOldHoldersOperationStream},
	{"StaleHolderRacingATakeoverNeverLeavesItsStreamCurrent", testStaleHolderRacingATakeover},
	{"LateAbortLeavesAFinishedOperationStreamWhole", testLateAbortLeavesAFinishedOperationStreamWhole},
}

// An AbortStream after a FinishStream that landed (its caller saw an error and aborts, as the
// runner does) leaves the stream finished with its events: the operation still runs under its
// holder then, so the holder's fence alone does not stop the abort.
func testLateAbortLeavesAFinishedOperationStreamWhole(t *testing.T, e *env) {
	b := e.open()
	stream, h := e.runningStream(t, b, "w1", time.Minute)
	ok(t, b.AppendEvents(stream, h, events(1, 3)))
	ok(t, b.FinishStream(stream, h, e.clock.Now().Add(time.Minute)))
	ok(t, b.AbortStream(stream, h))
	if p := must(b.ReadEvents(stream, 0, 10))(t); p.State != store.StreamFinished || len(p.List) != 3 {
		t.Fatalf("a finished operation stream after a late AbortStream: %v with %d events", p.State, len(p.List))
	}
}

// runningStream accepts operation 0, has worker claim it for lease, and begins its stream
// under a fresh attempt of worker.
func (e *env) runningStream(t *testing.T, b store.Backend, worker string, lease time.Duration) ([]byte, store.StreamHolder) {
	t.Helper()
	e.accept(t, b, "s", 0, 1)
	if op := must(b.ClaimNext(worker, lease))(t); op == nil || op.Holder != worker {
		t.Fatalf("claim by %s: %+v", worker, op)
	}
	h := store.OperationHolder(worker)
	ok(t, b.BeginStream([]byte(opID(0)), h, 200, sseHeader, time.Hour))
	return []byte(opID(0)), h
}

// The worker running an operation records its stream: followed live through another handle,
// then finished and kept as it was asked to. No idempotency key is borrowed for it, and a
// worker that does not hold the operation cannot begin one.
func testOperationStreamIsRecordedByItsHolder(t *testing.T, e *env) {
	b, other := e.open(), e.open()
	stream, h := e.runningStream(t, b, "w1", time.Minute)
	if err := b.BeginStream(stream, store.OperationHolder("w2"), 200, sseHeader, time.Hour); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("a worker not holding the operation began its stream: %v, want ErrNotHolder", err)
	}
	ok(t, b.AppendEvents(stream, h, events(1, 3)))
	p := must(other.ReadEvents(stream, 0, 10))(t)
	if p.State != store.StreamLive || p.Token != h.Token || p.Events != 3 || len(p.List) != 3 {
		t.Fatalf("the other handle reads %v under %q with %d of %d events", p.State, p.Token, len(p.List), p.Events)
	}
	ok(t, b.FinishStream(stream, h, e.clock.Now().Add(time.Minute)))
	if p := must(other.ReadEvents(stream, 1, 10))(t); p.State != store.StreamFinished || len(p.List) != 2 {
		t.Fatalf("after finish: %v with %d events after 1", p.State, len(p.List))
	}
	if rec := must(b.LookupKey(stream))(t); rec != nil {
		t.Fatalf("an operation's stream left an idempotency record: %+v", rec)
	}
	if op := must(b.GetOperation(opID(0)))(t); op.Status != store.StatusRunning {
		t.Fatalf("finishing the stream moved the operation to %s; the runner stores its result", op.Status)
	}
}

// A live stream reads as aborted once its holder no longer holds the operation: its lease ran
// out (its replica died), or the operation left running.
func testOperationStreamOfALostHolderReadsAsAborted(t *testing.T, e *env) {
	b := e.open()
	stream, h := e.runningStream(t, b, "w1", 30*time.Second)
	ok(t, b.AppendEvents(stream, h, events(1, 2)))
	e.clock.Advance(31 * time.Second)
	if p := must(b.ReadEvents(stream, 0, 10))(t); p.State != store.StreamAborted {
		t.Fatalf("the stream of a holder whose lease ran out reads as %v", p.State)
	}
	must(b.RenewLeases("w1", []string{opID(0)}, 30*time.Second))(t) // it was only slow: renewed
	if p := must(b.ReadEvents(stream, 0, 10))(t); p.State != store.StreamLive {
		t.Fatalf("after the holder renewed, the stream reads as %v", p.State)
	}
	must(b.Transition(opID(0), store.Change{To: store.StatusQueued, Holder: "w1"}))(t)
	if p := must(b.ReadEvents(stream, 0, 10))(t); p.State != store.StreamAborted || p.Events != 2 {
		t.Fatalf("the stream of a requeued operation reads as %v with %d events", p.State, p.Events)
	}
}

// After a takeover the old holder can neither begin, append to nor finish the operation's
// stream, and its abort changes nothing; the new holder's stream replaces the old one.
func testTakeoverFencesTheOldHoldersOperationStream(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	stream, old := e.runningStream(t, a, "w1", 30*time.Second)
	ok(t, a.AppendEvents(stream, old, events(1, 6)))
	e.clock.Advance(31 * time.Second)
	must(b.Transition(opID(0), store.Change{To: store.StatusQueued, Holder: "w1", LeaseExpired: true}))(t)
	if op := must(b.ClaimNext("w2", 30*time.Second))(t); op == nil || op.Holder != "w2" {
		t.Fatalf("takeover: %+v", op)
	}
	if err := a.AppendEvents(stream, old, events(7, 7)); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("the old holder appended after the takeover: %v, want ErrNotHolder", err)
	}
	if err := a.FinishStream(stream, old, e.clock.Now().Add(time.Minute)); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("the old holder finished after the takeover: %v, want ErrNotHolder", err)
	}
	if err := a.BeginStream(stream, store.OperationHolder("w1"), 200, sseHeader, time.Hour); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("the old holder began a stream after the takeover: %v, want ErrNotHolder", err)
	}
	ok(t, a.AbortStream(stream, old)) // nothing to do: it holds nothing
	next := store.OperationHolder("w2")
	ok(t, b.BeginStream(stream, next, 201, sseHeader, time.Hour))
	if err := a.AppendEvents(stream, old, events(7, 7)); !errors.Is(err, store.ErrStreamNotLive) {
		t.Fatalf("the old holder appended to the new holder's stream: %v, want ErrStreamNotLive", err)
	}
	ok(t, b.AppendEvents(stream, next, events(1, 2)))
	p := must(a.ReadEvents(stream, 0, 10))(t)
	if p.Token != next.Token || p.State != store.StreamLive || p.Status != 201 || p.Events != 2 || len(p.List) != 2 {
		t.Fatalf("the new holder's stream reads %+v", p)
	}
	if _, found, _ := a.FindEvent(stream, "5"); found {
		t.Fatal("found the old holder's event 5 in the new holder's stream")
	}
	ok(t, b.FinishStream(stream, next, e.clock.Now().Add(time.Minute)))
}

// Stale holders beginning streams over and over while the operation is taken over and its new
// holder begins never leave a stale stream current: each of them begins once more after the
// new holder's stream is in, and every one of those is refused.
func testStaleHolderRacingATakeover(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	stream, _ := e.runningStream(t, a, "w1", 30*time.Second)
	const stale = 4
	var (
		newBegun atomic.Bool
		wg       sync.WaitGroup
		failures = make(chan error, stale)
	)
	for range stale {
		wg.Go(func() {
			for i := 0; i < 10_000; i++ {
				last := newBegun.Load()
				err := a.BeginStream(stream, store.OperationHolder("w1"), 200, sseHeader, time.Hour)
				if err != nil && !errors.Is(err, store.ErrNotHolder) {
					failures <- err
					return
				}
				if last {
					if err == nil {
						failures <- errors.New("a stale holder began a stream after the new holder's")
					}
					return
				}
			}
		})
	}
	e.clock.Advance(31 * time.Second)
	must(b.Transition(opID(0), store.Change{To: store.StatusQueued, Holder: "w1", LeaseExpired: true}))(t)
	// A claim passes over a row another transaction holds at that moment (here a stale
	// holder's fence check) and answers none, for its caller to look again (store.Queue): the
	// takeover looks again while the stale holders keep the row busy.
	var op *store.Operation
	for range 100 {
		if op = must(b.ClaimNext("w2", time.Minute))(t); op != nil {
			break
		}
	}
	if op == nil || op.Holder != "w2" {
		t.Fatalf("takeover: %+v", op)
	}
	next := store.OperationHolder("w2")
	ok(t, b.BeginStream(stream, next, 200, sseHeader, time.Hour))
	newBegun.Store(true)
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	if p := must(b.ReadEvents(stream, 0, 0))(t); p.Token != next.Token || p.State != store.StreamLive {
		t.Fatalf("after the race the stream is %v under %q, want the new holder's %q", p.State, p.Token, next.Token)
	}
}

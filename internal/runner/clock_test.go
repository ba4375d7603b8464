package runner

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/courier"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// loopRunner is a storage's runner and courier without Caddy: real Badger on a temp directory,
// every attempt dispatched to an in-process handler, on a clock the test holds. The store reads
// the same clock, so leases, due times and the runner's timers move together.
type loopRunner struct {
	*Runner
	testkit.Queue
	st *badger.Store
}

// newLoopRunner starts no loop of the runner: a test claims with ClaimNext, or calls Start for
// the claim, heartbeat and takeover loops. cfg's zero concurrency and takeover take the
// defaults.
func newLoopRunner(t *testing.T, clock clockwork.Clock, handler http.Handler, cfg Config) *loopRunner {
	t.Helper()
	return newLoopRunnerIn(t, t.TempDir(), clock, handler, cfg)
}

// newLoopRunnerIn is newLoopRunner on the Badger directory dir.
func newLoopRunnerIn(t *testing.T, dir string, clock clockwork.Clock, handler http.Handler, cfg Config) *loopRunner {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: dir, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	deliveries := courier.New(courier.Options{Store: st, Worker: "wrk_courier", Clock: clock, Log: zap.NewNop()})
	r := New(Options{Store: st, Clock: clock, Log: zap.NewNop(), Courier: deliveries,
		Config: Config{Concurrency: cfg.Concurrency, Takeover: cfg.Takeover}})
	cfg.Dispatch = func(*store.Operation) http.Handler { return handler }
	r.Configure(testConfigOwner, cfg)
	lr := &loopRunner{Runner: r, st: st, Queue: testkit.Queue{St: st, Now: clock.Now, Told: r.Accepted}}
	t.Cleanup(func() {
		lr.Stop()
		deliveries.Stop()
		_ = st.Close()
	})
	return lr
}

// answerOK answers every attempt 200.
var answerOK = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"ok":true}`)) })

// chat is a chat completion's body asking content.
func chat(content string) string {
	return fmt.Sprintf(`{"model":"demo","messages":[{"role":"user","content":%q}]}`, content)
}

// testConfigOwner stands for the config that configures a loopRunner.
const testConfigOwner = "test config"

// chatPath is where the tests' operations post.
const chatPath = "/v1/chat/completions"

// testMaxResult is the tests' max_result, the gateway's default.
const testMaxResult = 32 << 20

// testExecution is how the operations of these tests run: timeout and retries as given.
func testExecution(timeout time.Duration, retries int) store.Execution {
	return store.Execution{Timeout: timeout, Retries: retries, MaxResult: testMaxResult, OnCrash: "requeue",
		Events: []string{"operation.succeeded", "operation.failed", "operation.canceled"}, Prefix: "/v1/operations"}
}

// newFakeClock is a fake clock at the present to the millisecond, as both backends store times
// (storetest.NewClock's start): events announced on the wall clock fall due on it at once.
func newFakeClock() *clockwork.FakeClock {
	return clockwork.NewFakeClockAt(time.Now().UTC().Truncate(time.Millisecond))
}

// timersAtLeast reports whether at least n timers wait on clock right now. A timer that fires
// leaves the count inside Advance, so asked right after an Advance it tells whether it fired.
func timersAtLeast(clock *clockwork.FakeClock, n int) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return clock.BlockUntilContext(ctx, n) == nil
}

// awaitWaiting waits until at least n timers wait on clock: the loops under test have parked.
func awaitWaiting(t *testing.T, clock *clockwork.FakeClock, n int, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clock.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("not within 10s: %s (%d timers on the clock)", what, n)
	}
}

// upstreamCall is one call a test's upstream received: when, on the test's clock, and a gate
// the test answers it through (the status the upstream answers with).
type upstreamCall struct {
	at     time.Time
	answer chan<- int
}

// gatedUpstream reports each call on calls and answers what the test sends back; with
// retryAfter set, a non-2xx answer carries it. A call whose execution is stopped reports its
// end on stopped.
func gatedUpstream(clock clockwork.Clock, retryAfter string) (http.Handler, <-chan upstreamCall, <-chan time.Time) {
	calls, stopped := make(chan upstreamCall, 8), make(chan time.Time, 8)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer := make(chan int, 1)
		calls <- upstreamCall{at: clock.Now(), answer: answer}
		select {
		case status := <-answer:
			if status >= 300 && retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"ok":true}`))
		case <-r.Context().Done():
			stopped <- clock.Now()
		}
	}), calls, stopped
}

// Timers on the clock of a runner whose loops were not begun, with no courier: each
// execution's timeout and lease expiry; a backoff between attempts adds one.
const (
	timersRunning    = 2
	timersBackingOff = 3
)

// answeredRetryAfter runs an operation with timeout on a fake clock whose first attempt the
// upstream answers 503 with Retry-After: 11; it returns what the test goes on with.
func answeredRetryAfter(t *testing.T, timeout time.Duration) (*loopRunner, *clockwork.FakeClock, <-chan upstreamCall, upstreamCall) {
	clock := newFakeClock()
	up, calls, _ := gatedUpstream(clock, "11")
	lr := newLoopRunner(t, clock, up, Config{})
	lr.Accept(t, "op_1", testExecution(timeout, 3), nil, chat("retry-after"))
	lr.ClaimNext()
	first := testkit.Receive(t, calls, "the first attempt")
	first.answer <- http.StatusServiceUnavailable
	return lr, clock, calls, first
}

// TestUpstreamRetryAfterIsHonouredUpToTheTimeout: a 503 asking for 11 s is retried after
// exactly 11 s on the clock (over the 10 s cap of the backoff itself) when the timeout leaves
// room, and ends the operation at once, the clock unmoved, when it does not.
func TestUpstreamRetryAfterIsHonouredUpToTheTimeout(t *testing.T) {
	t.Run("timeout 30s", func(t *testing.T) {
		lr, clock, calls, first := answeredRetryAfter(t, 30*time.Second)
		awaitWaiting(t, clock, timersBackingOff, "the backoff after the 503")
		clock.Advance(11*time.Second - time.Millisecond)
		if !timersAtLeast(clock, timersBackingOff) {
			t.Fatal("retried before the upstream's Retry-After of 11s")
		}
		clock.Advance(time.Millisecond)
		second := testkit.Receive(t, calls, "the retry at 11s")
		second.answer <- http.StatusOK
		if gap := second.at.Sub(first.at); gap != 11*time.Second {
			t.Fatalf("retried %v after the 503, want 11s", gap)
		}
		if op := lr.Await(t, "op_1"); op.Status != store.StatusSucceeded || op.Attempts != 2 {
			t.Fatalf("%s after %d attempts, want succeeded after 2", op.Status, op.Attempts)
		}
	})
	t.Run("timeout 5s", func(t *testing.T) {
		lr, _, _, first := answeredRetryAfter(t, 5*time.Second)
		op := lr.Await(t, "op_1")
		if op.Status != store.StatusFailed || op.Error == nil || op.Error.Code != string(apierr.CodeUpstreamUnavailable) || op.Attempts != 1 {
			t.Fatalf("%s %+v after %d attempts, want failed UPSTREAM_UNAVAILABLE after 1", op.Status, op.Error, op.Attempts)
		}
		if !op.FinishedAt.Equal(first.at) {
			t.Fatalf("finished %v after the 503: it waited for a retry that could not fit in the timeout", op.FinishedAt.Sub(first.at))
		}
	})
}

// TestRetryableFailuresAreRetriedWithinTheBackoffThenFail: each retry of a 503 comes within its
// backoff (250 ms doubling, full jitter: at most 500 ms, then 1 s), and after the retries the
// operation fails UPSTREAM_UNAVAILABLE with every attempt counted.
func TestRetryableFailuresAreRetriedWithinTheBackoffThenFail(t *testing.T) {
	clock := newFakeClock()
	up, calls, _ := gatedUpstream(clock, "")
	lr := newLoopRunner(t, clock, up, Config{})
	lr.Accept(t, "op_1", testExecution(time.Minute, 2), nil, chat("flaky"))
	lr.ClaimNext()
	call := testkit.Receive(t, calls, "the first attempt")
	for retry, ceiling := range []time.Duration{500 * time.Millisecond, time.Second} {
		call.answer <- http.StatusServiceUnavailable
		awaitWaiting(t, clock, timersBackingOff, "the backoff")
		clock.Advance(retryBase - time.Millisecond)
		if !timersAtLeast(clock, timersBackingOff) {
			t.Fatalf("retry %d came before the %v floor of the backoff", retry+1, retryBase)
		}
		clock.Advance(ceiling - retryBase + time.Millisecond)
		prev := call.at
		call = testkit.Receive(t, calls, "a retry within its backoff")
		if gap := call.at.Sub(prev); gap < retryBase || gap > ceiling {
			t.Fatalf("retry %d came %v after the failure, want within [%v, %v]", retry+1, gap, retryBase, ceiling)
		}
	}
	call.answer <- http.StatusServiceUnavailable
	op := lr.Await(t, "op_1")
	if op.Status != store.StatusFailed || op.Error == nil || op.Error.Code != string(apierr.CodeUpstreamUnavailable) || op.Attempts != 3 {
		t.Fatalf("%s %+v after %d attempts, want failed UPSTREAM_UNAVAILABLE after 3", op.Status, op.Error, op.Attempts)
	}
}

// TestExecutionStopsOnItsOwnClockBeforeItsLeaseEnds: when no renewal gets through, the holder
// stops the upstream call LeaseMargin before its lease ends, by its own clock, without waiting
// for the storage; the operation is left running for a takeover (docs/backends.md).
func TestExecutionStopsOnItsOwnClockBeforeItsLeaseEnds(t *testing.T) {
	const takeover = 2 * time.Second
	clock := newFakeClock()
	up, calls, stopped := gatedUpstream(clock, "")
	lr := newLoopRunner(t, clock, up, Config{Takeover: takeover}) // not begun: no heartbeat renews
	lr.Accept(t, "op_1", testExecution(time.Minute, 3), nil, chat("held"))
	lr.ClaimNext()
	testkit.Receive(t, calls, "the attempt")
	held, err := lr.st.GetOperation("op_1")
	if err != nil {
		t.Fatal(err)
	}
	stopAt := held.LeaseUntil.Add(-LeaseMargin(takeover))
	awaitWaiting(t, clock, timersRunning, "the execution's timers")
	clock.Advance(clock.Until(stopAt) - time.Millisecond)
	select {
	case at := <-stopped:
		t.Fatalf("stopped at %v, %v before the margin", at, stopAt.Sub(at))
	default:
	}
	clock.Advance(time.Millisecond)
	at := testkit.Receive(t, stopped, "the upstream call stopped before the lease ends")
	if !at.Before(held.LeaseUntil) {
		t.Fatalf("the upstream call ran until %v, past its lease's end at %v", at, held.LeaseUntil)
	}
	lr.inFlight.Wait()
	if op, err := lr.st.GetOperation("op_1"); err != nil || op.Status != store.StatusRunning || op.Holder != lr.worker {
		t.Fatalf("after the stop: %+v %v, want running under this worker's lapsing lease", op, err)
	}
}

// TestSilentWorkersOperationIsTakenOverOnlyAfterItsLease: an operation a worker claimed and then
// fell silent on is taken over and run here, never before its lease ended on the clock.
func TestSilentWorkersOperationIsTakenOverOnlyAfterItsLease(t *testing.T) {
	const takeover = 3 * time.Second
	clock := newFakeClock()
	up, calls, _ := gatedUpstream(clock, "")
	lr := newLoopRunner(t, clock, up, Config{Concurrency: 1, Takeover: takeover})
	lr.Accept(t, "op_1", testExecution(time.Minute, 3), nil, chat("orphan"))
	silent, err := lr.st.ClaimNext("wrk_silent", takeover)
	if err != nil || silent == nil {
		t.Fatalf("claim for the silent worker: %+v %v", silent, err)
	}
	lr.Start()
	var call upstreamCall
	testkit.WaitFor(t, 20*time.Second, "the takeover runs the operation here", func() bool {
		select {
		case call = <-calls:
			return true
		default:
			clock.Advance(200 * time.Millisecond) // time goes on while the loops poll
			return false
		}
	})
	call.answer <- http.StatusOK
	if call.at.Before(silent.LeaseUntil) {
		t.Fatalf("taken over %v before the silent worker's lease ended", silent.LeaseUntil.Sub(call.at))
	}
	op := lr.Await(t, "op_1")
	if op.Status != store.StatusSucceeded || op.Holder == "wrk_silent" {
		t.Fatalf("%s held by %s, want succeeded here", op.Status, op.Holder)
	}
	t.Logf("taken over %v after the lease ended (takeover every %v)", call.at.Sub(silent.LeaseUntil), takeoverEvery(takeover))
}

// TestOneExecutionOfAnOperationAtATimeInAProcess: when the runner claims an operation again
// while its earlier execution of it is still winding down (the lease ran out, a takeover
// requeued it), the new execution waits for the earlier one to end before it calls the
// upstream: a worker fences its writes (the operation's stream above all) by its own id, so two
// executions of one operation in one process must never overlap.
func TestOneExecutionOfAnOperationAtATimeInAProcess(t *testing.T) {
	clock := newFakeClock()
	release, calls := make(chan struct{}), make(chan bool, 2)
	var firstEnded atomic.Bool
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !firstEnded.Load() && len(calls) == 0 {
			calls <- false
			<-release // an execution slow to wind down: it ignores its cancellation a while
			firstEnded.Store(true)
			return
		}
		calls <- firstEnded.Load()
		w.WriteHeader(http.StatusOK)
	})
	lr := newLoopRunner(t, clock, up, Config{Concurrency: 2})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // runs before the runner's cleanup, which waits for the held call
	lr.Accept(t, "op_1", testExecution(time.Minute, 0), nil, chat("twice"))
	lr.ClaimNext()
	testkit.Receive(t, calls, "the first execution's call")
	clock.Advance(DefaultTakeover + time.Second) // its lease runs out: the expiry cancels it, in vain
	if _, err := lr.st.Transition("op_1", store.Change{To: store.StatusQueued, Holder: lr.worker, LeaseExpired: true}); err != nil {
		t.Fatal(err) // as a takeover does once the lease ran out
	}
	if !lr.ClaimNext() {
		t.Fatal("op_1, requeued, was not claimed again")
	}
	lr.mu.Lock()
	waits := lr.running["op_1"] != nil && lr.running["op_1"].after != nil
	lr.mu.Unlock()
	if !waits {
		t.Fatal("the second execution of op_1 does not wait for the first")
	}
	free()
	if ended := testkit.Receive(t, calls, "the second execution's call"); !ended {
		t.Fatal("the second execution called the upstream while the first still ran")
	}
	if op := lr.Await(t, "op_1"); op.Status != store.StatusSucceeded {
		t.Fatalf("op_1 %s, want succeeded by the second execution", op.Status)
	}
}

// An execution gives its slot to the next claim when its upstream work ends, but at most
// concurrency executions settle so at once: past that, one keeps its slot until it ends, so
// that outcomes held in memory while their writes are retried stay bounded.
func TestSettlingExecutionsAreBoundedByConcurrency(t *testing.T) {
	clock := newFakeClock()
	lr := newLoopRunner(t, clock, http.NotFoundHandler(), Config{Concurrency: 2})
	var exs []*execution
	for range 3 {
		ex := &execution{cancel: func(error) {}, done: make(chan struct{}), pooled: true, expiry: clock.NewTimer(time.Hour)}
		lr.mu.Lock()
		lr.pooled++
		lr.mu.Unlock()
		exs = append(exs, ex)
	}
	counts := func() (pooled, settling int) {
		lr.mu.Lock()
		defer lr.mu.Unlock()
		return lr.pooled, lr.settling
	}
	for _, ex := range exs {
		lr.freeSlot(ex)
	}
	if pooled, settling := counts(); pooled != 1 || settling != 2 || exs[2].slotFreed {
		t.Fatalf("pooled %d, settling %d, third freed %v: want 1 slot kept, 2 settling", pooled, settling, exs[2].slotFreed)
	}
	lr.freeSlot(exs[0]) // twice: no effect
	lr.executionEnded("a", exs[0])
	lr.executionEnded("c", exs[2])
	if pooled, settling := counts(); pooled != 0 || settling != 1 {
		t.Fatalf("after two ends: pooled %d, settling %d, want 0 and 1", pooled, settling)
	}
	lr.executionEnded("b", exs[1])
	if pooled, settling := counts(); pooled != 0 || settling != 0 {
		t.Fatalf("after all ends: pooled %d, settling %d", pooled, settling)
	}
}

// TestQueueDeadlinesAreReadOnTheRunnersClock: an operation's queue deadline passes when the
// runner's clock passes it, not the wall clock. On a clock an hour behind the wall, an
// operation due within a minute is claimed and run, and one left queued is failed
// QUEUE_TIMEOUT only once the clock moves past its deadline.
func TestQueueDeadlinesAreReadOnTheRunnersClock(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond))
	up, calls, _ := gatedUpstream(clock, "")
	lr := newLoopRunner(t, clock, up, Config{Concurrency: 1})
	deadline := clock.Now().Add(time.Minute)
	for _, id := range []string{"op_run", "op_wait"} {
		ex := testExecution(time.Minute, 0)
		lr.Put(t, &store.Operation{ID: id, Exec: &ex, QueueDeadline: deadline}, nil, chat(id))
	}

	lr.dropStale()
	if op, err := lr.st.GetOperation("op_wait"); err != nil || op.Status != store.StatusQueued {
		t.Fatalf("before its deadline on the runner's clock: %+v, %v; want it still queued", op, err)
	}
	if !lr.ClaimNext() {
		t.Fatal("nothing claimed")
	}
	testkit.Receive(t, calls, "the call of the operation claimed before its deadline").answer <- http.StatusOK
	if op := lr.Await(t, "op_run"); op.Status != store.StatusSucceeded {
		t.Fatalf("op_run: %s, want succeeded", op.Status)
	}

	clock.Advance(2 * time.Minute)
	lr.dropStale()
	op, err := lr.st.GetOperation("op_wait")
	if err != nil || op.Status != store.StatusFailed || op.Error == nil || op.Error.Code != string(apierr.CodeQueueTimeout) {
		t.Fatalf("past its deadline: %+v, %v; want failed %s", op, err, apierr.CodeQueueTimeout)
	}
}

package module

import (
	"net/http"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// loopRunner is a storage's runner and courier as the gateway builds them, without Caddy: real
// Badger on a temp directory, events announced and rendered as the gateway's, every attempt
// dispatched to an in-process handler, on a clock the test holds. The runner's own behaviour is
// tested in internal/runner; these tests are about what the gateway wires around it.
type loopRunner struct {
	*runner.Runner
	testkit.Queue
	st       *badger.Store
	clock    clockwork.Clock
	dispatch runner.Dispatcher
}

// newLoopRunner starts no loop of the runner: a test claims with ClaimNext, or calls Start.
// Without endpoints the courier is not started.
func newLoopRunner(t *testing.T, clock clockwork.Clock, handler http.Handler, concurrency int, endpoints map[string]*webhookSetup) *loopRunner {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	st.SetAnnouncer(runner.Announcer(clock, legacyExec()))
	r := newRunner(st, storageSpec{concurrency: concurrency}, newRegistry(), clock, zap.NewNop(), newCourier(st, clock, zap.NewNop()))
	lr := &loopRunner{Runner: r, st: st, clock: clock, dispatch: func(*store.Operation) http.Handler { return handler },
		Queue: testkit.Queue{St: st, Now: clock.Now, Told: r.Accepted}}
	lr.endpoints(endpoints)
	if endpoints != nil {
		r.Courier().Start() // without, nothing to deliver: the runner's timers alone are on the clock
	}
	t.Cleanup(func() {
		lr.Stop()
		lr.Courier().Stop()
		_ = st.Close()
	})
	return lr
}

// testConfigOwner stands for the config that configures a loopRunner.
const testConfigOwner = "test config"

// endpoints configures the runner as a config declaring e would.
func (lr *loopRunner) endpoints(e map[string]*webhookSetup) {
	cfg := lr.Settings()
	lr.Configure(testConfigOwner, runnerConfig(cfg.Concurrency, cfg.Takeover, cfg.Grace, lr.dispatch, e))
}

// testExecution is how the operations of these tests run: timeout and retries as given.
func testExecution(timeout time.Duration, retries int) store.Execution {
	return store.Execution{Timeout: timeout, Retries: retries, MaxResult: defaultMaxResult, OnCrash: CrashRequeue,
		Events: []string{EventSucceeded, EventFailed, EventCanceled}, Prefix: defaultOperationsPath}
}

// newFakeClock is a fake clock at the present to the millisecond, as both backends store times
// (storetest.NewClock's start): events announced on the wall clock fall due on it at once.
func newFakeClock() *clockwork.FakeClock {
	return clockwork.NewFakeClockAt(time.Now().UTC().Truncate(time.Millisecond))
}

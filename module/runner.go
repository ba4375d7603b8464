package module

import (
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/courier"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/store"
)

// The runner (internal/runner) works each storage's queue; module/ builds it with the storage
// (openStorage), hands it each config's settings (App.Start) and counts what it tells.

// attemptResult is what one upstream attempt produced (runner.Result): the runner's, or a
// converted call's first attempt, or a keyed call's answer the gate records.
type attemptResult = runner.Result

// newRunner is the runner of storage st as set describes it, on clock.
func newRunner(st store.Backend, set storageSpec, reg *registry, clock clockwork.Clock, log *zap.Logger, deliveries *courier.Courier) *runner.Runner {
	where := set.where()
	return runner.New(runner.Options{
		Store: st, Name: set.name(), Where: where, Clock: clock, Log: log, Courier: deliveries,
		Replicated: set.backend == BackendPostgres,
		Seats:      storageSeats{reg: reg, where: where},
		Legacy:     legacyExec(),
		Config:     runner.Config{Concurrency: set.concurrency, Takeover: set.takeover},
		Hooks: runner.Hooks{
			Settled:       countFinal,
			QueueWaited:   func(d time.Duration) { metrics.queueWait.Observe(d.Seconds()) },
			Retried:       func() { metrics.retries.Inc() },
			SeatWaited:    func(d time.Duration) { capacityMetrics.seatWait.Observe(d.Seconds()) },
			QueueTimedOut: func() { capacityMetrics.queueTimeouts.Inc() },
			CapacityStats: func() map[string]any { return capacityStats(st, reg.seatPoolsAt(where)) },
		},
	})
}

// runnerConfig is a config's settings for a storage's runner.
func runnerConfig(concurrency int, takeover, grace time.Duration, dispatch runner.Dispatcher, endpoints map[string]*webhookSetup) runner.Config {
	zeroWebhookCounters(endpoints)
	return runner.Config{Concurrency: concurrency, Takeover: takeover, Grace: grace, Dispatch: dispatch, Endpoints: courierEndpoints(endpoints)}
}

// legacyExec is how an operation stored before operations carried their settings runs.
func legacyExec() store.Execution {
	return store.Execution{Timeout: defaultAsyncTimeout, Retries: 3, MaxResult: defaultMaxResult, OnCrash: CrashRequeue,
		Events: []string{EventSucceeded, EventFailed, EventCanceled}, Prefix: defaultOperationsPath}
}

// execOf returns how op is to be run: as stored with it, or legacyExec.
func execOf(op *store.Operation) store.Execution { return runner.ExecOf(op, legacyExec()) }

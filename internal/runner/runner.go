// Package runner works a storage's queue of operations (docs/operating.md, docs/api.md): it
// claims queued operations while it has free slots, holds each by a lease it renews, takes over
// the operations of workers that fell silent, and executes each through the dispatcher the
// newest config hands it, with the settings stored with the operation: its retries, timeout,
// result limit, seats (docs/capacity.md) and streamed answer for followers (docs/streams.md).
// It imports neither Caddy nor the gateway: module/ builds it from Options, hands it each
// config's Config, and reads its Stats. Every decision reads the injected clock.
package runner

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/courier"
	"github.com/mulligan-gw/mulligan/internal/ids"
	"github.com/mulligan-gw/mulligan/internal/reqlog"
	"github.com/mulligan-gw/mulligan/internal/tracing"
	"github.com/mulligan-gw/mulligan/store"
)

// Runner is one worker on a storage's queue (docs/operating.md): it claims queued operations
// while it has free slots (`concurrency`), holds each by a lease it renews, and executes each
// with the settings stored with it. It belongs to the storage's lifetime in this process, not
// to one config: a reload hands it the new config's dispatch. Other processes on the same
// storage (PostgreSQL replicas) run runners of their own; the store decides who holds what.
type Runner struct {
	st      store.Backend
	worker  string // this runner's id in leases: random, one per runner
	name    string // the storage, as operators see it
	where   string // the storage, as seat pools name it
	log     *zap.Logger
	clock   clockwork.Clock  // real in production; a test's fake moves leases, retries and polls
	courier *courier.Courier // the storage's: the runner kicks it and hands it the config's endpoints
	seats   Capacity         // the seat pools of the storage's capacity blocks
	hooks   Hooks
	legacy  store.Execution // how an operation stored without its settings runs

	mu      sync.Mutex
	cfg     Config
	held    []heldConfig // the configs holding this runner, oldest first; cfg is the newest's
	running map[string]*execution
	// pooled counts the executions claimed from the queue that hold a slot: from their claim
	// until their upstream work ends (converted calls run outside the pool). claiming counts
	// the claims under way, each holding the slot it will fill.
	pooled   int
	claiming int
	// lookAgain says the loop woke while every free slot was claiming: those claims may have
	// looked before what woke it (work queued, a takeover's requeue), so the first to end
	// empty-handed (not failed: a failing storage waits for the poll) wakes the loop again
	// rather than leave the work to the next poll.
	lookAgain bool
	// settling counts the executions that gave their slot back and are writing their outcome:
	// at most concurrency, so that results held in memory stay bounded when writes are slow.
	settling int
	streams  opStreams            // the streamed answers of running attempts, for followers
	shared   store.StreamRecorder // the storage, when replicas share it: streams are copied there

	replicated bool // other processes may work the storage (PostgreSQL): see takeoverGrace

	queued   atomic.Int64 // queued operations in the storage, as last counted (admission, readiness)
	wake     chan struct{}
	renewNow chan struct{}
	stopping chan struct{} // no new claims
	stopped  chan struct{} // heartbeat and takeover end
	claims   sync.WaitGroup
	beats    sync.WaitGroup
	inFlight sync.WaitGroup
}

// Config is what the latest config gives a storage's runner.
type Config struct {
	Concurrency int                         // 0: DefaultConcurrency
	Takeover    time.Duration               // the lease; 0: DefaultTakeover
	Grace       time.Duration               // how long a stopping gateway lets running operations finish; 0: defaultGrace
	Dispatch    Dispatcher                  // what attempts go through: the config's Caddy servers
	Endpoints   map[string]courier.Endpoint // webhook endpoints of every block on the storage
}

// Dispatcher returns the handler an operation's attempts are sent through, or nil when the
// config serving now has none for it (the attempt then fails as an unreachable upstream). In
// production it is the config's Caddy servers; a test hands it any http.Handler, so the runner
// runs without Caddy.
type Dispatcher func(op *store.Operation) http.Handler

// Capacity finds the seat pools of a storage's capacity blocks (docs/capacity.md).
type Capacity interface {
	// Pools lists the pools whose operations the storage holds; none without capacity.
	Pools() []*capacity.Seats
	// PoolFor returns the pool of the block serving the operations prefix; nil without.
	PoolFor(prefix string) *capacity.Seats
	// Upstream returns the request an attempt of op, seated in its block's pool, sends: req,
	// or a copy the block changes (pass_priority, docs/capacity.md).
	Upstream(op *store.Operation, req *store.Request) *store.Request
}

// Hooks are what the runner tells the gateway around it (its metrics, its stats); any may be
// nil.
type Hooks struct {
	// Settled is told of every operation this runner brought to a final status: executed,
	// taken over, dropped past its queue deadline, or canceled while queued.
	Settled func(op *store.Operation)
	// QueueWaited is told how long an operation waited in the queue, when its execution begins.
	QueueWaited func(time.Duration)
	// Retried is told of every attempt that is retried.
	Retried func()
	// SeatWaited is told how long the queue's head waited for a seat before its claim.
	SeatWaited func(time.Duration)
	// QueueTimedOut is told of every operation failed QUEUE_TIMEOUT.
	QueueTimedOut func()
	// CapacityStats is what Stats shows of the storage's seat pools; nil without capacity.
	CapacityStats func() map[string]any
}

// Options are what a runner is built from.
type Options struct {
	Store   store.Backend
	Name    string // the storage, as operators see it
	Where   string // the storage, as seat pools name it
	Clock   clockwork.Clock
	Log     *zap.Logger
	Courier *courier.Courier
	// Replicated is set when other processes may work the storage (PostgreSQL): leases are
	// taken over only past a grace, and streams are copied to the store for their followers.
	Replicated bool
	Seats      Capacity
	Hooks      Hooks
	// Legacy is how an operation stored before operations carried their settings runs.
	Legacy store.Execution
	// Config is the settings until the first config's: its concurrency and takeover.
	Config Config
}

// heldConfig is one config's settings for the runner, kept while that config holds the storage.
type heldConfig struct {
	owner any
	cfg   Config
}

// execution is one operation being executed here.
type execution struct {
	cancel    context.CancelCauseFunc
	done      chan struct{}
	pooled    bool // claimed from the queue: it holds one of the concurrency slots
	slotFreed bool // its upstream work ended: the slot went to the next claim (freeSlot)
	// settling is set once its upstream work has ended and it writes its outcome: it has no call
	// left to stop, and its fenced write tells it whether it still held the operation.
	settling   bool
	leaseUntil time.Time       // as last renewed
	started    time.Time       // when it began running here, for the oldest-running gauge
	seat       *capacity.Seat  // the seat it was claimed with (capacity), until its first attempt takes it
	expiry     clockwork.Timer // stops the execution shortly before its lease ends (see leaseMargin)
	// after, when set, is the end of an earlier execution of the same operation here, still
	// winding down when this runner claimed the operation again (its lease ran out and a
	// takeover requeued it): this one starts only once that one has ended.
	after <-chan struct{}
}

// Causes of an execution's cancellation.
var (
	// errCanceledByUser wraps context.Canceled: net/http returns the cause of a canceled call,
	// and reverse_proxy treats a call ended by context.Canceled as the client's doing (499, no
	// error) but any other error as the upstream's (a 502 in Caddy's error log, with the
	// request's headers). A cancel asked for by a client is not an error (docs/operating.md).
	errCanceledByUser = fmt.Errorf("canceled by request (%w)", context.Canceled)
	errRunnerStopping = errors.New("the gateway is stopping")
	errLeaseLost      = errors.New("the operation's lease was lost to another worker")
	errResultTooLarge = capture.ErrTooLarge
)

// The defaults of the storage-wide settings (docs/caddyfile.md, `async`).
const (
	DefaultConcurrency = 4
	DefaultTakeover    = 30 * time.Second
)

// defaultGrace applies when the config sets no grace_period.
const defaultGrace = 5 * time.Second

// pollEvery is how often an idle runner looks at the queue without a wake-up (the fallback
// that keeps every property without LISTEN/NOTIFY).
const pollEvery = time.Second

// New returns a runner on o.Store; Start sets it going.
func New(o Options) *Runner {
	h := o.Hooks
	h.Settled = orNop1(h.Settled)
	h.QueueWaited = orNop1(h.QueueWaited)
	h.SeatWaited = orNop1(h.SeatWaited)
	if h.Retried == nil {
		h.Retried = func() {}
	}
	if h.QueueTimedOut == nil {
		h.QueueTimedOut = func() {}
	}
	if h.CapacityStats == nil {
		h.CapacityStats = func() map[string]any { return nil }
	}
	if o.Seats == nil {
		o.Seats = noSeats{}
	}
	cfg := o.Config
	if cfg.Grace <= 0 {
		cfg.Grace = defaultGrace
	}
	r := &Runner{
		st: o.Store, worker: ids.New("wrk_", o.Clock.Now()), name: o.Name, where: o.Where, log: o.Log.Named("runner"), clock: o.Clock,
		cfg: cfg, running: map[string]*execution{}, wake: make(chan struct{}, 1), renewNow: make(chan struct{}, 1),
		stopping: make(chan struct{}), stopped: make(chan struct{}), courier: o.Courier,
		seats: o.Seats, hooks: h, legacy: o.Legacy, replicated: o.Replicated,
	}
	if o.Replicated {
		r.shared = o.Store
	}
	return r
}

func orNop1[T any](f func(T)) func(T) {
	if f == nil {
		return func(T) {}
	}
	return f
}

// noSeats is the capacity of a storage without capacity blocks.
type noSeats struct{}

func (noSeats) Pools() []*capacity.Seats       { return nil }
func (noSeats) PoolFor(string) *capacity.Seats { return nil }
func (noSeats) Upstream(_ *store.Operation, req *store.Request) *store.Request {
	return req
}

// Start begins claiming, renewing and taking over; shutdown (or drain) stops it.
func (r *Runner) Start() {
	r.countQueued()
	r.claims.Add(1)
	go r.claimLoop()
	r.beats.Add(2)
	go r.heartbeat()
	go r.takeOverLoop()
}

// configure hands the runner the settings of owner, a config that has just started: the
// newest config's dispatch and endpoints are the ones operations and events go through.
func (r *Runner) Configure(owner any, c Config) {
	if c.Concurrency < 1 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Takeover <= 0 {
		c.Takeover = DefaultTakeover
	}
	if c.Grace <= 0 {
		c.Grace = defaultGrace
	}
	r.mu.Lock()
	r.held = append(slices.DeleteFunc(r.held, func(h heldConfig) bool { return h.owner == owner }), heldConfig{owner, c})
	r.apply(c)
}

// release forgets owner's settings when that config lets go. If they were in use (a reload
// that failed to start after this runner was configured), the newest config still holding the
// storage takes over again, so operations never run through the servers of a config that is
// not serving.
func (r *Runner) Release(owner any) {
	r.mu.Lock()
	wasNewest := len(r.held) > 0 && r.held[len(r.held)-1].owner == owner
	r.held = slices.DeleteFunc(r.held, func(h heldConfig) bool { return h.owner == owner })
	if !wasNewest || len(r.held) == 0 {
		r.mu.Unlock()
		return
	}
	r.apply(r.held[len(r.held)-1].cfg)
}

// apply makes c the runner's settings; r.mu is held and is released.
func (r *Runner) apply(c Config) {
	r.cfg = c
	r.mu.Unlock()
	r.courier.Configure(c.Endpoints)
	r.Kick()
}

func (r *Runner) Settings() Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg
}

// Shutdown stops claiming. When the process goes on working this storage under another handle
// (shared), running executions are left to finish (drain, in the background), still held by
// this runner's leases: a reload never hands back or repeats a call under way. Otherwise they
// get the grace period, then are handed back to the queue. It reports whether it is done
// (false: the caller drains), and the end of the grace period, what is left of which the
// storage gives its courier.
func (r *Runner) Shutdown(shared bool) (time.Time, bool) {
	close(r.stopping)
	r.claims.Wait()
	if shared {
		return time.Time{}, false
	}
	deadline := r.clock.Now().Add(r.Settings().Grace)
	finished := make(chan struct{})
	go func() { r.inFlight.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-r.clock.After(r.clock.Until(deadline)):
		r.stopAll(errRunnerStopping)
		<-finished
	}
	r.endBeats()
	return deadline, true
}

// Stop stops claiming, stops the executions under way at once (each goes back to the queue, as
// past a grace period) and returns once they and the runner's loops have ended. A storage stops
// its runner with Shutdown, which gives executions their grace period first.
func (r *Runner) Stop() {
	close(r.stopping)
	r.claims.Wait()
	r.stopAll(errRunnerStopping)
	r.inFlight.Wait()
	r.endBeats()
}

// Drain waits for the executions under way, then stops the rest.
func (r *Runner) Drain() {
	r.inFlight.Wait()
	r.endBeats()
}

func (r *Runner) endBeats() {
	close(r.stopped)
	r.beats.Wait()
}

// alive reports whether the runner still claims work.
func (r *Runner) Alive() bool {
	select {
	case <-r.stopping:
		return false
	default:
		return true
	}
}

// kick wakes the claim loop.
func (r *Runner) Kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Runner) claimLoop() {
	defer r.claims.Done()
	tick := r.clock.NewTicker(pollEvery)
	defer tick.Stop()
	wakeups := r.st.Wakeups()
	for {
		r.claimFree()
		select {
		case <-r.stopping:
			return
		case <-r.wake:
		case <-tick.Chan():
		case <-wakeups: // queued work or a cancel, maybe from another replica
			select {
			case r.renewNow <- struct{}{}:
			default:
			}
		}
	}
}

// claimFree starts a claim for every free slot and returns. A claim holds its slot while it
// waits for its fsync (durability sync); claims made at once share one (group commit), and a
// slot that comes free meanwhile starts its own claim at once rather than wait for the others'
// to end: the async end-to-end profiles showed slots standing empty behind a batch of claims
// (docs/benchmarks.md).
func (r *Runner) claimFree() {
	if !r.Alive() {
		return
	}
	r.mu.Lock()
	free := r.cfg.Concurrency - r.pooled - r.claiming
	if len(r.seats.Pools()) > 0 {
		// With capacity, one claim at a time: the queue's head waits for a seat in its pool's
		// order before it is claimed (docs/capacity.md, "Waiting is not running"); a claim
		// that started one wakes the loop for the next.
		free = min(free, 1-r.claiming)
	}
	if free <= 0 && r.claiming > 0 {
		r.lookAgain = true
	}
	r.mu.Unlock()
	for range free {
		r.claims.Add(1) // the loop holds one count until it ends, so this never races the Wait
		go func() {
			defer r.claims.Done()
			r.ClaimNext()
		}()
	}
}

// ClaimNext claims and starts the oldest queued operation if a slot is free, holding the slot
// while it claims; it reports whether it claimed one.
func (r *Runner) ClaimNext() bool {
	r.mu.Lock()
	if r.pooled+r.claiming >= r.cfg.Concurrency {
		r.mu.Unlock()
		return false
	}
	r.claiming++
	takeover := r.cfg.Takeover
	r.mu.Unlock()
	started, failed := false, false
	defer func() {
		if !started {
			r.mu.Lock()
			r.claiming--
			again := r.lookAgain && !failed // a failed claim leaves the next look to the poll
			if again {
				r.lookAgain = false
			}
			r.mu.Unlock()
			if again {
				r.Kick()
			}
		}
	}()
	if !r.Alive() {
		return false
	}
	op, held, err := r.claimQueued(takeover)
	if err != nil {
		failed = true
		r.log.Warn("claiming queued work", zap.Error(err))
		return false
	}
	if op == nil {
		return false
	}
	r.countMoved(op, -1)
	r.log.Info("operation transition", tracing.OperationFields(op, zap.String("old_status", string(store.StatusQueued)),
		zap.String("new_status", string(op.Status)), zap.Int("attempts", op.Attempts), zap.Duration("queue_wait", op.StartedAt.Sub(op.SubmittedAt)))...)
	if r.expiredInQueue(op) {
		held.GiveBack()
		r.Kick() // its slot is free again, and more may be queued
		return true
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	started = true
	r.start(op, ctx, &execution{cancel: cancel, done: make(chan struct{}), pooled: true, leaseUntil: op.LeaseUntil, seat: held}, nil)
	r.Kick() // more may be queued, for a slot still free
	return true
}

// accepted counts an operation this process queued, and wakes the claim loop.
func (r *Runner) Accepted() {
	r.queued.Add(1)
	r.Kick()
}

// launchConverted sees through a call converted after it started, accepted as running under
// this runner's lease: first delivers the outcome of the attempt under way, which runs on
// ctx. It runs outside the pool: it was never queued.
func (r *Runner) LaunchConverted(op *store.Operation, ctx context.Context, cancel context.CancelCauseFunc, first <-chan Result) {
	r.start(op, ctx, &execution{cancel: cancel, done: make(chan struct{}), leaseUntil: op.LeaseUntil, started: op.StartedAt}, first)
}

func (r *Runner) start(op *store.Operation, ctx context.Context, ex *execution, first <-chan Result) {
	if ex.started.IsZero() {
		ex.started = r.clock.Now()
	}
	r.mu.Lock()
	if prev := r.running[op.ID]; prev != nil {
		ex.after = prev.done
	}
	r.running[op.ID] = ex
	if ex.pooled {
		r.claiming-- // the claim's slot is the execution's now
		r.pooled++
	}
	r.armExpiry(op.ID, ex, r.cfg.Takeover)
	r.mu.Unlock()
	r.inFlight.Add(1)
	go func() {
		defer r.inFlight.Done()
		defer r.executionEnded(op.ID, ex)
		if ex.after != nil {
			// One execution of an operation at a time in a process. Streams are fenced by the
			// worker (docs/streams.md): an earlier execution's late writes would pass the fence of
			// this one's, and its end would take this one's place in running.
			<-ex.after
		}
		r.execute(ctx, ex, op, first)
	}()
}

// freeSlot gives an execution's slot to the next claim once its upstream work has ended: the
// slots bound calls to the upstream, and what is left (the final write and its fsync) need not
// hold one. The next claim's fsync may then share the final write's.
//
// At most concurrency executions settle so at once: past that (the writes are failing or slow,
// and a settling execution holds its result for up to finishRetryFor), an execution keeps its
// slot until it ends, and no more work is claimed meanwhile.
func (r *Runner) freeSlot(ex *execution) {
	r.mu.Lock()
	ex.settling = true
	freed := ex.pooled && !ex.slotFreed && r.settling < r.cfg.Concurrency
	if freed {
		ex.slotFreed = true
		r.pooled--
		r.settling++
	}
	r.mu.Unlock()
	if freed {
		r.Kick()
	}
}

// executionEnded does the bookkeeping of an execution that ended here: its slot, its lease
// timer, its unused place in the capacity order; then it wakes the claim loop.
func (r *Runner) executionEnded(id string, ex *execution) {
	r.mu.Lock()
	if r.running[id] == ex { // else a later execution of the operation has its place already
		delete(r.running, id)
	}
	switch {
	case ex.slotFreed:
		r.settling--
	case ex.pooled:
		r.pooled--
	}
	ex.expiry.Stop()
	pending := ex.seat
	ex.seat = nil
	r.mu.Unlock()
	pending.GiveBack() // ended before its first attempt: its seat goes to the next
	ex.cancel(nil)
	close(ex.done)
	r.Kick()
}

// cancel stops a running operation's upstream call; it returns a channel closed when the
// execution has ended, or nil when this runner is not executing id.
func (r *Runner) Cancel(id string) <-chan struct{} {
	return r.stopExecution(id, errCanceledByUser)
}

func (r *Runner) stopExecution(id string, cause error) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ex, ok := r.running[id]
	if !ok {
		return nil
	}
	ex.cancel(cause)
	return ex.done
}

func (r *Runner) stopAll(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ex := range r.running {
		ex.cancel(cause)
	}
}

// cancelQueued cancels queued operation op at once: its final status counted, its event
// announced, the transition logged. It fails with store.ErrIllegalTransition when op has left
// the queue meanwhile: the change is guarded by From, so a runner's claim between the caller's
// read and this change is never cancelled as a queued one (its call would run on uncut, and
// the queued count would drop twice); the caller cancels it as a running one instead.
func (r *Runner) CancelQueued(op *store.Operation, log reqlog.Logger) (*store.Operation, error) {
	canceled, err := r.st.Transition(op.ID, store.Change{To: store.StatusCanceled, From: store.StatusQueued})
	if err != nil {
		return nil, err
	}
	r.hooks.Settled(canceled)
	r.countMoved(canceled, -1)
	r.courier.Kick()
	log.Info("operation transition", tracing.OperationFields(op, zap.String("old_status", "queued"), zap.String("new_status", "canceled"))...)
	return canceled, nil
}

// countMoved moves the queued count by d for op entering or leaving the queue; batch lines are
// not in it (store.Operations.QueueStats).
func (r *Runner) countMoved(op *store.Operation, d int64) {
	if op.Batch == nil {
		r.queued.Add(d)
	}
}

// countQueued recounts the storage's queue: other replicas queue and claim too.
func (r *Runner) countQueued() {
	if queued, _, err := r.st.QueueStats(); err == nil {
		r.queued.Store(int64(queued))
	}
}

// ExecOf returns how op is to be run: as stored with it, or, for an operation stored before
// operations carried it, legacy.
func ExecOf(op *store.Operation, legacy store.Execution) store.Execution {
	if op.Exec != nil {
		return *op.Exec
	}
	return legacy
}

func (r *Runner) execOf(op *store.Operation) store.Execution { return ExecOf(op, r.legacy) }

// handlerFor returns what op's attempts go through under the newest config; nil before any
// config has started.
func (r *Runner) handlerFor(op *store.Operation) http.Handler {
	if d := r.Settings().Dispatch; d != nil {
		return d(op)
	}
	return nil
}

// Worker is this runner's id in leases.
func (r *Runner) Worker() string { return r.worker }

// Store is the storage the runner works.
func (r *Runner) Store() store.Backend { return r.st }

// Courier is the storage's courier, which the runner kicks and configures.
func (r *Runner) Courier() *courier.Courier { return r.courier }

// Clock is the clock the runner's decisions read.
func (r *Runner) Clock() clockwork.Clock { return r.clock }

// Log is the runner's logger.
func (r *Runner) Log() *zap.Logger { return r.log }

// Queued is the storage's count of queued operations, as last counted (admission, readiness).
func (r *Runner) Queued() int64 { return r.queued.Load() }

// Stats is a snapshot of a storage's runner and its outbox: GET /mulligan/stats
// (docs/operating.md, Admin API).
type Stats struct {
	Storage          string         `json:"storage"`
	Worker           string         `json:"worker"`
	Queued           int64          `json:"queued"`
	Running          int            `json:"running"`
	RunningFromQueue int            `json:"running_from_queue"`
	Concurrency      int            `json:"concurrency"`
	Takeover         string         `json:"takeover"`
	Webhooks         WebhookStats   `json:"webhooks"`
	Capacity         map[string]any `json:"capacity,omitempty"` // nil without capacity
}

// WebhookStats is the outbox's counts beside what its courier is doing.
type WebhookStats struct {
	Pending     int `json:"pending"`
	DeadLetters int `json:"dead_letters"`
	courier.Stats
}

// stats is a snapshot of the runner and its outbox.
func (r *Runner) Stats() Stats {
	r.mu.Lock()
	running, pooled, cfg := len(r.running), r.pooled, r.cfg
	r.mu.Unlock()
	pending, dead, _ := r.st.CountEvents()
	return Stats{
		Storage: r.name, Worker: r.worker, Queued: r.queued.Load(), Running: running, RunningFromQueue: pooled,
		Concurrency: cfg.Concurrency, Takeover: cfg.Takeover.String(),
		Webhooks: WebhookStats{Pending: pending, DeadLetters: dead, Stats: r.courier.Stats()},
		Capacity: r.hooks.CapacityStats(),
	}
}

// runningSince reports how many operations this runner is executing and when the earliest of
// them began (zero when none is).
func (r *Runner) RunningSince() (int, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var oldest time.Time
	for _, ex := range r.running {
		if oldest.IsZero() || ex.started.Before(oldest) {
			oldest = ex.started
		}
	}
	return len(r.running), oldest
}

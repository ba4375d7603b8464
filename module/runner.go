package module

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/courier"
	"github.com/mulligan-gw/mulligan/internal/tracing"
	"github.com/mulligan-gw/mulligan/store"
)

// runner is one worker on a storage's queue (docs/operating.md): it claims queued operations
// while it has free slots (`concurrency`), holds each by a lease it renews, and executes each
// with the settings stored with it. It belongs to the storage's lifetime in this process, not
// to one config: a reload hands it the new config's dispatch. Other processes on the same
// storage (PostgreSQL replicas) run runners of their own; the store decides who holds what.
type runner struct {
	st      store.Backend
	worker  string // this runner's id in leases: random, one per runner
	name    string // the storage, as operators see it
	where   string // the storage, as seat pools name it
	log     *zap.Logger
	clock   clockwork.Clock  // real in production; a test's fake moves leases, retries and polls
	courier *courier.Courier // the storage's: the runner kicks it and hands it the config's endpoints

	mu      sync.Mutex
	cfg     runnerConfig
	held    []heldConfig // the configs holding this runner, oldest first; cfg is the newest's
	running map[string]*execution
	// pooled counts the executions claimed from the queue that hold a slot: from their claim
	// until their upstream work ends (converted calls run outside the pool). claiming counts
	// the claims under way, each holding the slot it will fill.
	pooled   int
	claiming int
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

// runnerConfig is what the latest config gives a storage's runner.
type runnerConfig struct {
	concurrency int
	takeover    time.Duration
	grace       time.Duration            // how long a stopping gateway lets running operations finish
	dispatch    dispatcher               // what attempts go through: the config's Caddy servers (serverDispatch)
	endpoints   map[string]*webhookSetup // webhook endpoints of every block on the storage
}

// heldConfig is one config's settings for the runner, kept while that config holds the storage.
type heldConfig struct {
	owner any
	cfg   runnerConfig
}

// execution is one operation being executed here.
type execution struct {
	cancel     context.CancelCauseFunc
	done       chan struct{}
	pooled     bool            // claimed from the queue: it holds one of the concurrency slots
	slotFreed  bool            // its upstream work ended: the slot went to the next claim (freeSlot)
	leaseUntil time.Time       // as last renewed
	started    time.Time       // when it began running here, for the oldest-running gauge
	seat       *seat           // the seat it was claimed with (capacity), until its first attempt takes it
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

// defaultGrace applies when the config sets no grace_period.
const defaultGrace = 5 * time.Second

// pollEvery is how often an idle runner looks at the queue without a wake-up (the fallback
// that keeps every property without LISTEN/NOTIFY).
const pollEvery = time.Second

func newRunner(st store.Backend, set storageSpec, clock clockwork.Clock, log *zap.Logger, deliveries *courier.Courier) *runner {
	r := &runner{
		st: st, worker: newID("wrk_", clock.Now()), name: set.name(), where: set.where(), log: log.Named("runner"), clock: clock,
		cfg:     runnerConfig{concurrency: set.concurrency, takeover: set.takeover, grace: defaultGrace},
		running: map[string]*execution{}, wake: make(chan struct{}, 1), renewNow: make(chan struct{}, 1),
		stopping: make(chan struct{}), stopped: make(chan struct{}), courier: deliveries,
	}
	if set.backend == BackendPostgres {
		r.shared = st
	}
	r.replicated = set.backend == BackendPostgres
	return r
}

// Start begins claiming, renewing and taking over; shutdown (or drain) stops it.
func (r *runner) Start() {
	r.countQueued()
	r.claims.Add(1)
	go r.claimLoop()
	r.beats.Add(2)
	go r.heartbeat()
	go r.takeOverLoop()
}

// configure hands the runner the settings of owner, a config that has just started: the
// newest config's dispatch and endpoints are the ones operations and events go through.
func (r *runner) configure(owner any, c runnerConfig) {
	if c.concurrency < 1 {
		c.concurrency = defaultConcurrency
	}
	if c.takeover <= 0 {
		c.takeover = defaultTakeover
	}
	if c.grace <= 0 {
		c.grace = defaultGrace
	}
	r.mu.Lock()
	r.held = append(slices.DeleteFunc(r.held, func(h heldConfig) bool { return h.owner == owner }), heldConfig{owner, c})
	r.apply(c)
}

// release forgets owner's settings when that config lets go. If they were in use (a reload
// that failed to start after this runner was configured), the newest config still holding the
// storage takes over again, so operations never run through the servers of a config that is
// not serving.
func (r *runner) release(owner any) {
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
func (r *runner) apply(c runnerConfig) {
	r.cfg = c
	r.mu.Unlock()
	zeroWebhookCounters(c.endpoints)
	r.courier.Configure(courierEndpoints(c.endpoints))
	r.kick()
}

func (r *runner) config() runnerConfig {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg
}

// shutdown stops claiming. When the process goes on working this storage under another handle
// (shared), running executions are left to finish (drain, in the background), still held by
// this runner's leases: a reload never hands back or repeats a call under way. Otherwise they
// get the grace period, then are handed back to the queue. It reports whether it is done
// (false: the caller drains), and the end of the grace period, what is left of which the
// storage gives its courier.
func (r *runner) shutdown(shared bool) (time.Time, bool) {
	close(r.stopping)
	r.claims.Wait()
	if shared {
		return time.Time{}, false
	}
	deadline := r.clock.Now().Add(r.config().grace)
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

// drain waits for the executions under way, then stops the rest.
func (r *runner) drain() {
	r.inFlight.Wait()
	r.endBeats()
}

func (r *runner) endBeats() {
	close(r.stopped)
	r.beats.Wait()
}

// alive reports whether the runner still claims work.
func (r *runner) alive() bool {
	select {
	case <-r.stopping:
		return false
	default:
		return true
	}
}

// kick wakes the claim loop.
func (r *runner) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *runner) claimLoop() {
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
func (r *runner) claimFree() {
	if !r.alive() {
		return
	}
	r.mu.Lock()
	free := r.cfg.concurrency - r.pooled - r.claiming
	if len(seatPoolsOf(r.where)) > 0 {
		// With capacity, one claim at a time: the queue's head waits for a seat in its pool's
		// order before it is claimed (docs/capacity.md, "Waiting is not running"); a claim
		// that started one wakes the loop for the next.
		free = min(free, 1-r.claiming)
	}
	r.mu.Unlock()
	for range free {
		r.claims.Add(1) // the loop holds one count until it ends, so this never races the Wait
		go func() {
			defer r.claims.Done()
			r.claimNext()
		}()
	}
}

// claimNext claims and starts the oldest queued operation if a slot is free, holding the slot
// while it claims; it reports whether it claimed one.
func (r *runner) claimNext() bool {
	r.mu.Lock()
	if r.pooled+r.claiming >= r.cfg.concurrency {
		r.mu.Unlock()
		return false
	}
	r.claiming++
	takeover := r.cfg.takeover
	r.mu.Unlock()
	started := false
	defer func() {
		if !started {
			r.mu.Lock()
			r.claiming--
			r.mu.Unlock()
		}
	}()
	if !r.alive() {
		return false
	}
	op, held, err := r.claimQueued(takeover)
	if err != nil {
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
		r.kick() // its slot is free again, and more may be queued
		return true
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	started = true
	r.start(op, ctx, &execution{cancel: cancel, done: make(chan struct{}), pooled: true, leaseUntil: op.LeaseUntil, seat: held}, nil)
	r.kick() // more may be queued, for a slot still free
	return true
}

// accepted counts an operation this process queued, and wakes the claim loop.
func (r *runner) accepted() {
	r.queued.Add(1)
	r.kick()
}

// launchConverted sees through a call converted after it started, accepted as running under
// this runner's lease: first delivers the outcome of the attempt under way, which runs on
// ctx. It runs outside the pool: it was never queued.
func (r *runner) launchConverted(op *store.Operation, ctx context.Context, cancel context.CancelCauseFunc, first <-chan attemptResult) {
	r.start(op, ctx, &execution{cancel: cancel, done: make(chan struct{}), leaseUntil: op.LeaseUntil, started: op.StartedAt}, first)
}

func (r *runner) start(op *store.Operation, ctx context.Context, ex *execution, first <-chan attemptResult) {
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
	r.armExpiry(op.ID, ex, r.cfg.takeover)
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
func (r *runner) freeSlot(ex *execution) {
	r.mu.Lock()
	freed := ex.pooled && !ex.slotFreed && r.settling < r.cfg.concurrency
	if freed {
		ex.slotFreed = true
		r.pooled--
		r.settling++
	}
	r.mu.Unlock()
	if freed {
		r.kick()
	}
}

// executionEnded does the bookkeeping of an execution that ended here: its slot, its lease
// timer, its unused place in the capacity order; then it wakes the claim loop.
func (r *runner) executionEnded(id string, ex *execution) {
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
	r.kick()
}

// cancel stops a running operation's upstream call; it returns a channel closed when the
// execution has ended, or nil when this runner is not executing id.
func (r *runner) cancel(id string) <-chan struct{} {
	return r.stopExecution(id, errCanceledByUser)
}

func (r *runner) stopExecution(id string, cause error) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ex, ok := r.running[id]
	if !ok {
		return nil
	}
	ex.cancel(cause)
	return ex.done
}

func (r *runner) stopAll(cause error) {
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
func (r *runner) cancelQueued(op *store.Operation, log reqLog) (*store.Operation, error) {
	canceled, err := r.st.Transition(op.ID, store.Change{To: store.StatusCanceled, From: store.StatusQueued})
	if err != nil {
		return nil, err
	}
	countFinal(canceled)
	r.countMoved(canceled, -1)
	r.courier.Kick()
	log.Info("operation transition", tracing.OperationFields(op, zap.String("old_status", "queued"), zap.String("new_status", "canceled"))...)
	return canceled, nil
}

// countMoved moves the queued count by d for op entering or leaving the queue; batch lines are
// not in it (store.Operations.QueueStats).
func (r *runner) countMoved(op *store.Operation, d int64) {
	if op.Batch == nil {
		r.queued.Add(d)
	}
}

// countQueued recounts the storage's queue: other replicas queue and claim too.
func (r *runner) countQueued() {
	if queued, _, err := r.st.QueueStats(); err == nil {
		r.queued.Store(int64(queued))
	}
}

// execOf returns how op is to be run: as stored with it, or, for an operation stored before
// operations carried it, the defaults.
func execOf(op *store.Operation) store.Execution {
	if op.Exec != nil {
		return *op.Exec
	}
	return store.Execution{Timeout: defaultAsyncTimeout, Retries: 3, MaxResult: defaultMaxResult, OnCrash: CrashRequeue,
		Events: []string{EventSucceeded, EventFailed, EventCanceled}, Prefix: defaultOperationsPath}
}

// runnerStats is a snapshot of a storage's runner and its outbox: GET /mulligan/stats
// (docs/operating.md, Admin API).
type runnerStats struct {
	Storage          string         `json:"storage"`
	Worker           string         `json:"worker"`
	Queued           int64          `json:"queued"`
	Running          int            `json:"running"`
	RunningFromQueue int            `json:"running_from_queue"`
	Concurrency      int            `json:"concurrency"`
	Takeover         string         `json:"takeover"`
	Webhooks         webhookStats   `json:"webhooks"`
	Capacity         map[string]any `json:"capacity,omitempty"` // nil without capacity
}

// webhookStats is the outbox's counts beside what its courier is doing.
type webhookStats struct {
	Pending     int `json:"pending"`
	DeadLetters int `json:"dead_letters"`
	courier.Stats
}

// stats is a snapshot of the runner and its outbox.
func (r *runner) stats() runnerStats {
	r.mu.Lock()
	running, pooled, cfg := len(r.running), r.pooled, r.cfg
	r.mu.Unlock()
	pending, dead, _ := r.st.CountEvents()
	return runnerStats{
		Storage: r.name, Worker: r.worker, Queued: r.queued.Load(), Running: running, RunningFromQueue: pooled,
		Concurrency: cfg.concurrency, Takeover: cfg.takeover.String(),
		Webhooks: webhookStats{Pending: pending, DeadLetters: dead, Stats: r.courier.Stats()},
		Capacity: r.capacityStats(),
	}
}

// runningSince reports how many operations this runner is executing and when the earliest of
// them began (zero when none is).
func (r *runner) runningSince() (int, time.Time) {
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

package module

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
)

// runner executes the operations of one store: a FIFO queue kept in the store, drained by at
// most `concurrency` upstream calls at once. It belongs to the store's lifetime, not to one
// config: a reload hands the new config's servers to the same runner, calls under way finish,
// and the new handler chain runs what is queued. One runner exists per storage directory; the
// last config started sets its limits.
type runner struct {
	dir  string
	refs int
	st   *store.Store
	log  *zap.Logger

	courier *courier

	mu      sync.Mutex
	cfg     AsyncConfig
	prefix  string // where operations are served, for the links in events
	hooks   *hooks
	grace   time.Duration
	servers map[string]*caddyhttp.Server
	fifo    []string // ids of queued operations, oldest first; canceled ones are skipped when reached
	running map[string]*execution
	pooled  int // running executions started from the queue (converted calls run outside it)

	queued   atomic.Int64
	wake     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	inFlight sync.WaitGroup
}

// execution is one operation being executed.
type execution struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
	pooled bool
}

// Causes of an execution's cancellation.
var (
	errCanceledByUser = errors.New("canceled by request")
	errRunnerStopping = errors.New("the gateway is stopping")
	errResultTooLarge = errors.New("the upstream response is over max_result")
)

var (
	runnersMu sync.Mutex
	runners   = map[string]*runner{}
)

// runnerSettings is what a config gives its runner.
type runnerSettings struct {
	async  AsyncConfig
	prefix string
	hooks  *hooks
	grace  time.Duration // how long a stopping gateway lets running operations finish
}

// defaultGrace applies when the config sets no grace_period.
const defaultGrace = 5 * time.Second

// acquireRunner returns the runner of the store in opts.Dir, starting it (and recovering what a
// crash left running) if it is not running yet, and gives it the config's settings and servers.
func acquireRunner(opts store.Options, set runnerSettings, servers map[string]*caddyhttp.Server, log *zap.Logger) (*runner, error) {
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	runnersMu.Lock()
	defer runnersMu.Unlock()
	if r, ok := runners[dir]; ok {
		r.refs++
		r.configure(set, servers)
		return r, nil
	}
	st, err := store.Open(opts)
	if err != nil {
		return nil, err
	}
	r := &runner{
		dir: dir, refs: 1, st: st, log: log.Named("runner"),
		running: map[string]*execution{}, wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{}),
		courier: newCourier(st, log),
	}
	r.configure(set, servers)
	st.SetAnnouncer(r.announce)
	st.SetSyncObserver(func(n int) { metrics.fsyncBatch.Observe(float64(n)) })
	if err := r.recoverCrashed(); err != nil {
		r.courier.stop()
		_ = st.Close()
		return nil, err
	}
	runners[dir] = r
	go r.loop()
	return r, nil
}

// liveRunner returns the running runner of dir with one more reference, or nil.
func liveRunner(dir string) *runner {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil
	}
	runnersMu.Lock()
	defer runnersMu.Unlock()
	r := runners[abs]
	if r != nil {
		r.refs++
	}
	return r
}

// release drops one reference; the last one stops the runner: no operation starts any more,
// running ones get the grace period to finish and are then handed back to the queue, the
// courier gets what is left of it to deliver due events, and the store handle closes.
func (r *runner) release() {
	runnersMu.Lock()
	r.refs--
	last := r.refs == 0
	if last {
		delete(runners, r.dir)
	}
	runnersMu.Unlock()
	if !last {
		return
	}
	close(r.stop)
	<-r.done
	r.mu.Lock()
	deadline := time.Now().Add(r.grace)
	r.mu.Unlock()
	finished := make(chan struct{})
	go func() { r.inFlight.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(time.Until(deadline)):
		r.mu.Lock()
		for _, ex := range r.running {
			ex.cancel(errRunnerStopping)
		}
		r.mu.Unlock()
		<-finished
	}
	r.courier.flush(deadline)
	r.courier.stop()
	_ = r.st.Close()
}

func (r *runner) configure(set runnerSettings, servers map[string]*caddyhttp.Server) {
	r.mu.Lock()
	r.cfg, r.prefix, r.hooks, r.servers = set.async, set.prefix, set.hooks, servers
	r.grace = set.grace
	if r.grace <= 0 {
		r.grace = defaultGrace
	}
	r.mu.Unlock()
	r.courier.configure(set.hooks)
	r.kick()
}

// eventTypes names the event announcing each status.
var eventTypes = map[store.Status]string{
	store.StatusSucceeded: EventSucceeded, store.StatusFailed: EventFailed,
	store.StatusCanceled: EventCanceled, store.StatusRunning: EventRunning,
}

// announce is the store's announcer: the event for op's new status, written in the same
// transaction, when the operation has a callback and the config delivers that event type.
func (r *runner) announce(op *store.Operation, result *store.Response) *store.Event {
	r.mu.Lock()
	h, prefix := r.hooks, r.prefix
	r.mu.Unlock()
	typ := eventTypes[op.Status]
	if op.Callback == nil || h == nil || !h.events[typ] {
		return nil
	}
	now := time.Now()
	payload, err := json.Marshal(viewOf(prefix, op, result, now))
	if err != nil {
		return nil
	}
	return &store.Event{
		ID: newID("evt_", now), Type: typ, OperationID: op.ID, Version: op.Version,
		Endpoint: op.Callback.Endpoint, URL: op.Callback.URL, OccurredAt: now, Operation: payload,
	}
}

func (r *runner) config() AsyncConfig {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg
}

// alive reports whether the runner's loop is running.
func (r *runner) alive() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// kick wakes the loop to look at the queue.
func (r *runner) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// recoverCrashed settles operations a dead process left running: asked to cancel -> canceled;
// else re-queued, or failed with WORKER_LOST under on_crash fail.
func (r *runner) recoverCrashed() error {
	ids, err := r.st.OperationsIn(store.StatusRunning)
	if err != nil {
		return err
	}
	for _, id := range ids {
		op, err := r.st.GetOperation(id)
		if err != nil {
			return err
		}
		change := store.Change{To: store.StatusQueued}
		switch {
		case !op.CancelRequestedAt.IsZero():
			change = store.Change{To: store.StatusCanceled}
		case r.cfg.OnCrash == CrashFail:
			change = store.Change{To: store.StatusFailed, Error: catalogueError(CodeWorkerLost, "The gateway stopped while this operation was running.")}
		}
		final, err := r.st.Transition(id, change)
		if err != nil {
			return err
		}
		if final.Status.Final() {
			countFinal(final)
		}
		r.log.Info("recovered operation", zap.String("operation_id", id), zap.String("old_status", string(op.Status)), zap.String("new_status", string(change.To)))
	}
	queued, err := r.st.OperationsIn(store.StatusQueued)
	r.fifo = queued
	r.queued.Store(int64(len(queued)))
	return err
}

// enqueue adds an accepted operation to the in-memory FIFO. The store holds the durable queue
// (its q/ index, read back at start); this copy spares the loop a scan of it, which would walk
// Badger's tombstones of every operation already dequeued.
func (r *runner) enqueue(id string) {
	r.mu.Lock()
	r.fifo = append(r.fifo, id)
	r.mu.Unlock()
	r.queued.Add(1)
	r.kick()
}

// dequeue returns the oldest id in the FIFO, or "" when a slot is not free or it is empty.
func (r *runner) dequeue() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pooled >= r.cfg.Concurrency || len(r.fifo) == 0 {
		return ""
	}
	id := r.fifo[0]
	r.fifo[0] = ""
	r.fifo = r.fifo[1:]
	if len(r.fifo) == 0 {
		r.fifo = nil // let the backing array go
	}
	return id
}

func (r *runner) loop() {
	defer close(r.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if r.startNext() {
			continue
		}
		select {
		case <-r.stop:
			return
		case <-r.wake:
		case <-tick.C:
		}
	}
}

// startNext starts the oldest queued operation if a slot is free; it reports whether it took
// one from the queue.
func (r *runner) startNext() bool {
	id := r.dequeue()
	if id == "" {
		return false
	}
	op, err := r.st.Transition(id, store.Change{To: store.StatusRunning})
	if errors.Is(err, store.ErrIllegalTransition) || errors.Is(err, store.ErrNotFound) {
		return true // canceled while it waited: already taken off the count
	}
	if err != nil {
		r.log.Error("starting an operation", zap.String("operation_id", id), zap.Error(err))
		r.mu.Lock()
		r.fifo = append([]string{id}, r.fifo...) // try again on the next tick
		r.mu.Unlock()
		return false
	}
	r.queued.Add(-1)
	r.log.Info("operation transition", zap.String("operation_id", op.ID), zap.String("old_status", string(store.StatusQueued)),
		zap.String("new_status", string(op.Status)), zap.Int("attempts", op.Attempts), zap.Duration("queue_wait", op.StartedAt.Sub(op.SubmittedAt)))
	r.launch(op)
	return true
}

// launch executes a queued op in the background, in a slot of the pool.
func (r *runner) launch(op *store.Operation) {
	ctx, cancel := context.WithCancelCause(context.Background())
	r.start(op, ctx, &execution{cancel: cancel, done: make(chan struct{}), pooled: true}, nil)
}

// launchConverted sees through a call converted after it started: first delivers the outcome
// of the attempt under way, which runs on ctx. It runs outside the pool: it was never queued.
func (r *runner) launchConverted(op *store.Operation, ctx context.Context, cancel context.CancelCauseFunc, first <-chan attemptResult) {
	r.start(op, ctx, &execution{cancel: cancel, done: make(chan struct{})}, first)
}

func (r *runner) start(op *store.Operation, ctx context.Context, ex *execution, first <-chan attemptResult) {
	r.adopt(op.ID, ex)
	r.inFlight.Add(1)
	go func() {
		defer r.inFlight.Done()
		defer r.settle(op.ID, ex)
		r.execute(ctx, op, first)
	}()
}

func (r *runner) adopt(id string, ex *execution) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running[id] = ex
	if ex.pooled {
		r.pooled++
	}
}

func (r *runner) settle(id string, ex *execution) {
	r.mu.Lock()
	delete(r.running, id)
	if ex.pooled {
		r.pooled--
	}
	r.mu.Unlock()
	ex.cancel(nil)
	close(ex.done)
	r.kick()
}

// cancel stops a running operation's upstream call; it returns a channel closed when the
// execution has ended, or nil when this runner is not executing id.
func (r *runner) cancel(id string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ex, ok := r.running[id]
	if !ok {
		return nil
	}
	ex.cancel(errCanceledByUser)
	return ex.done
}

// server returns the current config's server of that name.
func (r *runner) server(name string) *caddyhttp.Server {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.servers[name]
}

package batches

import (
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
)

// Worker moves a storage's batches along (docs/batches.md): it validates input files, creates
// line operations in chunks, and cuts the lines of cancelled and expired batches. The runner
// executes the lines; the storage counts them and settles each batch with its last. Every step
// is idempotent and fenced in the storage, so replicas may run it side by side and a crash at
// any point is resumed by the next pass.
type Worker struct {
	st    store.Backend
	clock clockwork.Clock
	log   *zap.Logger
	lines Lines

	kickc    chan struct{}
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	swept    map[string]time.Time // when each batch's lines were last cut
	active   map[string]store.BatchStatus
	cursors  map[string]*cursor // where each batch's input file is read up to
	passes   uint64             // cursor uses, for dropping the least recent
	window   int
}

// Lines is what the worker asks of the runner that executes a storage's lines.
type Lines interface {
	// Kick wakes the runner: lines were created.
	Kick()
	// Cancel stops line id if this process is running it.
	Cancel(id string)
	// Cut is told of a queued line the worker ended (cancelled or expired), to count it as the
	// runner counts the lines it finishes (operation and line metrics both).
	Cut(op *store.Operation)
}

// Options are a Worker's parts.
type Options struct {
	Store store.Backend
	Lines Lines
	// Clock paces the passes and decides expiry; nil is the real clock.
	Clock clockwork.Clock
	Log   *zap.Logger
	// Window bounds a batch's lines created and not final; 0 is LineWindow.
	Window int
}

// Pacing of the batch worker.
const (
	passEvery  = 500 * time.Millisecond
	sweepEvery = 2 * time.Second // a cancelled batch's lines are cut again this often until it settles
	lineChunk  = 500             // line operations created per transaction
	chunkBytes = 4 << 20         // ... or fewer, to keep a transaction under this
	// LineWindow bounds a batch's lines created and not final: the rest are created as these
	// finish, so a 50,000-line batch never fills the queue (`queue`, readiness) nor makes the
	// interactive operations behind it wait for all of it.
	LineWindow = 2000
)

// New returns a worker on opts.Store, not started.
func New(opts Options) *Worker {
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.Window <= 0 {
		opts.Window = LineWindow
	}
	return &Worker{st: opts.Store, clock: opts.Clock, log: opts.Log.Named("batches"), lines: opts.Lines,
		kickc: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		swept: map[string]time.Time{}, active: map[string]store.BatchStatus{}, cursors: map[string]*cursor{},
		window: opts.Window}
}

// Start begins the passes: one every passEvery, and one soon after each Kick.
func (w *Worker) Start() { go w.loop() }

// Stop ends the passes and returns once the one under way (if any) has ended, so the storage
// can close after it. It is safe to call more than once, and before Start only if Start is
// never called.
func (w *Worker) Stop() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

// Kick asks for a pass soon (a batch was created or cancelled).
func (w *Worker) Kick() {
	select {
	case w.kickc <- struct{}{}:
	default:
	}
}

func (w *Worker) loop() {
	defer close(w.done)
	defer w.dropCursors()
	t := w.clock.NewTicker(passEvery)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-w.kickc:
		case <-t.Chan():
		}
		w.pass()
	}
}

// stopping reports whether Stop was called: a pass ends between batches.
func (w *Worker) stopping() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// pass advances every batch not final.
func (w *Worker) pass() {
	ids, err := w.st.UnsettledBatches()
	if err != nil {
		w.log.Warn("listing batches", zap.Error(err))
		return
	}
	counts := map[store.BatchStatus]float64{store.BatchValidating: 0, store.BatchInProgress: 0, store.BatchCancelling: 0}
	seen := make(map[string]store.BatchStatus, len(ids))
	for _, id := range ids {
		if w.stopping() {
			return
		}
		b, err := w.advance(id)
		if err != nil {
			w.log.Warn("advancing a batch", zap.String("batch_id", id), zap.Error(err))
			continue
		}
		if b != nil && !b.Status.Final() {
			counts[b.Status]++
			seen[id] = b.Status
		}
	}
	for st, n := range counts {
		metrics.active.WithLabelValues(string(st)).Set(n)
	}
	w.forgetFinished(seen)
}

// forgetFinished drops what the worker kept of batches that left the unsettled list since the
// last pass. They are counted where they settle (Settled), not here: every replica's
// worker sees each batch leave.
func (w *Worker) forgetFinished(seen map[string]store.BatchStatus) {
	for id := range w.active {
		if _, still := seen[id]; !still {
			delete(w.swept, id)
		}
	}
	for id := range w.cursors {
		if _, still := seen[id]; !still {
			w.dropCursor(id)
		}
	}
	w.active = seen
}

// advance takes batch id one step further and returns it as it then is.
func (w *Worker) advance(id string) (*store.Batch, error) {
	b, err := w.st.GetBatch(id)
	if err != nil || b.Status.Final() {
		return b, err
	}
	if b.Status == store.BatchValidating {
		return w.validate(b)
	}
	if b.Status == store.BatchInProgress && !b.Expiring && !w.clock.Now().Before(b.ExpiresAt) {
		if b, err = w.st.UpdateBatch(id, func(b *store.Batch) error { b.Expiring = true; return nil }); err != nil {
			return nil, err
		}
		w.log.Info("batch past its completion window", zap.String("batch_id", id))
	}
	// The cut goes before the lines are created: a batch whose remaining lines cannot be
	// created still has its running ones stopped.
	if (b.Status == store.BatchCancelling || b.Expiring) && w.clock.Now().Sub(w.swept[id]) >= sweepEvery {
		w.swept[id] = w.clock.Now()
		if err := w.cutLines(b); err != nil {
			return b, err
		}
	}
	if b.Created < b.Counts.Total {
		return w.createLines(b)
	}
	return b, nil
}

// validate reads the input file: a batch with bad lines fails naming each; otherwise it goes
// in progress with its total, and its lines are created next.
func (w *Worker) validate(b *store.Batch) (*store.Batch, error) {
	n, errs, err := w.readInput(b)
	if err != nil {
		return b, err
	}
	now := w.clock.Now()
	return w.st.UpdateBatch(b.ID, func(b *store.Batch) error {
		if b.Status != store.BatchValidating {
			return nil // cancelled meanwhile
		}
		if len(errs) > 0 {
			b.Status, b.FailedAt, b.Errors = store.BatchFailed, now, errs
			return nil
		}
		b.Status, b.InProgressAt, b.Counts.Total = store.BatchInProgress, now, n
		return nil
	})
}

// readInput validates b's input file; a file gone meanwhile is one error.
func (w *Worker) readInput(b *store.Batch) (int, []store.BatchError, error) {
	rc, err := w.st.OpenFile(b.InputFileID)
	if errors.Is(err, store.ErrNotFound) {
		return 0, []store.BatchError{{Code: "file_not_found", Message: "The input file was deleted before the batch was validated."}}, nil
	}
	if err != nil {
		return 0, nil, err
	}
	defer rc.Close()
	return ValidateLines(countReads(rc), b.Endpoint)
}

// createLines stores b's line operations from the first not yet created, in chunks, reading
// on from where the last pass stopped (the batch's input cursor). A chunk another worker stored
// first (ErrStale) ends this pass: the next one resumes after it.
func (w *Worker) createLines(b *store.Batch) (*store.Batch, error) {
	c, err := w.cursorAt(b)
	if errors.Is(err, store.ErrNotFound) {
		return w.failMissingLines(b)
	}
	if err != nil {
		return b, err
	}
	for b.Created < b.Counts.Total && b.Created-b.Counts.Completed-b.Counts.Failed < w.window {
		ops, reqs := w.nextChunk(b, c)
		if len(ops) == 0 {
			err := c.sc.Err()
			w.dropCursor(b.ID)
			if err != nil {
				return b, err
			}
			return w.failMissingLines(b) // the file no longer holds the lines it was validated with
		}
		if b, err = w.addLines(b, ops, reqs); err != nil || b.Status.Final() {
			w.dropCursor(b.ID) // where the file stands is no longer known
			return b, err
		}
	}
	return b, nil
}

// addLines stores a chunk of b's lines; a chunk another worker stored first (ErrStale) answers
// the batch as it now is, so the next pass resumes after it.
func (w *Worker) addLines(b *store.Batch, ops []*store.Operation, reqs []*store.Request) (*store.Batch, error) {
	next, err := w.st.AddBatchLines(b.ID, b.Created, ops, reqs)
	if errors.Is(err, store.ErrStale) {
		return w.st.GetBatch(b.ID)
	}
	if err != nil {
		return b, err
	}
	for _, op := range ops {
		if op.Status.Final() {
			CountLine(op)
		}
	}
	w.lines.Kick()
	return next, nil
}

// inputGone is the error of line `line` whose input file went away before the line was created
// (expired, or deleted past the pin of docs/batches.md): its custom_id is lost with the file, so
// the message names the line.
func inputGone(line int) string {
	return fmt.Sprintf("Line %d of the input file was never sent: the file expired or was deleted before the batch read it.", line)
}

// failMissingLines stores b's lines not yet created as failed, each with inputGone's error, in
// chunks, so a batch whose input file went away still ends with every line accounted for.
func (w *Worker) failMissingLines(b *store.Batch) (*store.Batch, error) {
	w.log.Warn("batch input file gone: the lines not yet created fail", zap.String("batch_id", b.ID),
		zap.String("input_file_id", b.InputFileID), zap.Int("missing", b.Counts.Total-b.Created))
	var err error
	for !b.Status.Final() && b.Created < b.Counts.Total {
		var ops []*store.Operation
		for line := b.Created + 1; line <= b.Counts.Total && len(ops) < lineChunk; line++ {
			op := w.lineOperation(b, line, "", &store.Request{Method: "POST", URL: b.Endpoint})
			op.Status, op.FinishedAt = store.StatusFailed, op.UpdatedAt
			op.Error = &store.OperationError{Code: store.LineInputGone, Message: inputGone(line)}
			ops = append(ops, op)
		}
		if b, err = w.addLines(b, ops, make([]*store.Request, len(ops))); err != nil {
			return b, err
		}
	}
	return b, nil
}

// nextChunk reads the next lines of b from c into operations and their requests.
func (w *Worker) nextChunk(b *store.Batch, c *cursor) ([]*store.Operation, []*store.Request) {
	sc := c.sc
	var ops []*store.Operation
	var reqs []*store.Request
	size := 0
	// Up to the window exactly: at most that many lines exist unfinished (docs/batches.md).
	limit := min(lineChunk, w.window-(b.Created-b.Counts.Completed-b.Counts.Failed))
	for line := b.Created + 1; len(ops) < limit && size < chunkBytes && line <= b.Counts.Total && sc.Scan(); line++ {
		c.line++
		in, bad := ParseLine(sc.Bytes(), b.Endpoint)
		if bad != nil {
			break // validated already: the file changed under the batch, which files never do
		}
		req := store.LineRequest(b, in.Method, in.URL, in.Body) // Body is Unmarshal's copy, not the scanner's buffer
		ops = append(ops, w.lineOperation(b, line, *in.CustomID, req))
		reqs = append(reqs, req)
		size += len(in.Body)
	}
	return ops, reqs
}

// lineOperation is line `line` of b as an operation: queued at urgency 7 in a scope of the
// batch's own (so the creator's operation list and max_per_scope leave it out), with the
// block's execution settings and no operation events (the batch has its own).
func (w *Worker) lineOperation(b *store.Batch, line int, customID string, req *store.Request) *store.Operation {
	now := w.clock.Now()
	ex := store.Execution{}
	if b.Exec != nil {
		ex = *b.Exec
	}
	ex.Events = nil
	path := req.URL
	if u, err := url.ParseRequestURI(req.URL); err == nil {
		path = u.Path
	}
	window := b.ExpiresAt.Sub(b.CreatedAt)
	return &store.Operation{ID: store.LineOperationID(b.ID, line), Scope: b.ID, Server: b.Server,
		Status: store.StatusQueued, Version: 1, Method: req.Method, Path: path, SubmittedAt: now, UpdatedAt: now,
		// A line's result outlives the batch's end by the batch's retention at least.
		Retention: b.Retention + window + ex.Timeout, Type: "batch", Exec: &ex, Urgency: batchUrgency,
		Batch: &store.BatchLine{Batch: b.ID, Line: line, CustomID: customID}}
}

// batchUrgency is the RFC 9218 urgency batch lines wait at: the least urgent, so they fill
// seats interactive calls leave idle (docs/batches.md).
const batchUrgency = 7

// cutLines ends the lines of a cancelled or expired batch that have not started: each is
// canceled with why; a cancelled batch's running lines are then stopped as an operation cancel
// stops them, an expired batch's finish. Queued lines go first, while the seats are still
// taken by the running ones, so the runner does not start them in between.
func (w *Worker) cutLines(b *store.Batch) error {
	code, msg := store.LineCancelled, "The batch was cancelled before this request ran."
	if b.Status != store.BatchCancelling {
		code, msg = store.LineExpired, "This request could not be executed before the completion window expired."
	}
	var running []string
	for line := 1; line <= b.Created; line++ {
		op, err := w.st.GetOperation(store.LineOperationID(b.ID, line))
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		switch op.Status {
		case store.StatusQueued:
			if err := w.cutQueued(op.ID, code, msg); err != nil {
				return err
			}
		case store.StatusRunning:
			if op.CancelRequestedAt.IsZero() {
				running = append(running, op.ID)
			}
		}
	}
	if b.Status != store.BatchCancelling {
		return nil
	}
	for _, id := range running {
		if _, err := w.st.RequestCancel(id, w.clock.Now()); err != nil {
			return err
		}
		w.lines.Cancel(id) // running here: stopped now; elsewhere: at its next lease renewal
	}
	return nil
}

// cutQueued cancels a queued line with why; one that started meanwhile is left to run (or to
// the next sweep): the cut is guarded by From in the store's transaction, so a line a runner
// claimed after it was read here is never cancelled under it.
func (w *Worker) cutQueued(id, code, msg string) error {
	cut, err := w.st.Transition(id, store.Change{To: store.StatusCanceled, From: store.StatusQueued,
		Error: &store.OperationError{Code: code, Message: msg}})
	if errors.Is(err, store.ErrIllegalTransition) {
		return nil
	}
	if err == nil {
		w.lines.Cut(cut) // batch lines are not in the queued count (the runner's countMoved)
	}
	return err
}

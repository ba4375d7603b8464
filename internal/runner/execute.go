package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/clocks"
	"github.com/mulligan-gw/mulligan/internal/responses"
	"github.com/mulligan-gw/mulligan/internal/tracing"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/webhook"
)

// execKey marks a request the runner sends through the server: the mulligan handler passes it
// straight to the rest of its route.
type execKey struct{}

// Executing reports whether ctx is an attempt's request, sent by a runner.
func Executing(ctx context.Context) bool { return ctx.Value(execKey{}) != nil }

// DefaultRetryOn are the statuses that say "try again" (timeouts, rate limits, a gateway or
// an upstream unavailable for now).
var DefaultRetryOn = []int{408, 429, 502, 503, 504}

// RetrySet is a retry_on list as a set; an empty one (an operation stored before retry_on
// existed) is DefaultRetryOn.
func RetrySet(codes []int) map[int]bool {
	if len(codes) == 0 {
		codes = DefaultRetryOn
	}
	set := make(map[int]bool, len(codes))
	for _, code := range codes {
		set[code] = true
	}
	return set
}

// queueTimedOut is the change failing an operation that waited past its queue deadline.
func queueTimedOut() store.Change {
	return store.Change{To: store.StatusFailed, Error: apierr.Failure(apierr.CodeQueueTimeout,
		"The operation waited in the queue past its deadline (max_queue_wait or Max-Queue-Wait) and was never sent upstream.")}
}

// Result is what one upstream attempt produced.
type Result struct {
	Status int // 0: no response (transport error or cancellation)
	Header http.Header
	Body   []byte
	Over   bool // the response passed max_result
	// Panicked is what a handler of the route panicked with (never http.ErrAbortHandler), and
	// Stack where: the attempt failed, the process goes on.
	Panicked any
	Stack    []byte
	// Cut is, for a background response whose attempt ended without a whole answer (cut by a
	// cancel, the timeout, the upstream breaking off, max_result), the event stream it had
	// relayed so far: within max_result, as the stream is given only what the capture keeps.
	Cut *store.Response
}

// ResultOf is the attempt's result of an answer a capture writer recorded.
func ResultOf(r capture.Recorded) Result {
	return Result{Status: r.Status, Header: r.Header, Body: r.Body, Over: r.Over}
}

// Retry pacing of upstream attempts: exponential with full jitter, honouring Retry-After.
const (
	retryBase = 250 * time.Millisecond
	retryCap  = 10 * time.Second
)

// execute runs op to a final status (or back to the queue when the gateway stops), retrying as
// the outcome table says, with the settings stored with op by the block that accepted it.
func (r *Runner) execute(parent context.Context, ex *execution, op *store.Operation, first <-chan Result) {
	settings := r.execOf(op)
	ctx, cancel := clocks.WithTimeout(parent, r.clock, settings.Timeout)
	defer cancel()
	log := r.log.With(tracing.OperationFields(op)...)
	retryOn := RetrySet(settings.RetryOn)
	if first == nil {
		r.hooks.QueueWaited(op.StartedAt.Sub(op.SubmittedAt))
		tracing.RecordQueueWait(op)
	}
	ctx, span := tracing.StartExecution(ctx, op)
	var last store.Change // what the execution came to, for its span
	defer func() { tracing.EndExecution(span, last) }()
	// settle writes where the execution came to; its upstream work is over, so its slot goes
	// to the next claim first.
	settle := func(c store.Change) {
		last = c
		r.freeSlot(ex)
		r.finish(parent, op.ID, c, log)
	}
	var req *store.Request
	if first == nil {
		var err error
		if req, err = r.st.LoadRequest(op.ID); err != nil {
			log.Error("loading the operation's request", zap.Error(err))
			change := store.Change{To: store.StatusFailed, Error: apierr.Failure(apierr.CodeWorkerLost, "The stored request could not be read.")}
			if !errors.Is(err, store.ErrNotFound) {
				change = store.Change{To: store.StatusQueued} // storage trouble: another attempt later
			}
			settle(change)
			return
		}
	}
	for attempt := 0; ; attempt++ {
		var res Result
		if attempt == 0 && first != nil {
			res = <-first
		} else {
			if req == nil {
				var err error
				if req, err = r.st.LoadRequest(op.ID); err != nil {
					log.Error("loading the operation's request", zap.Error(err))
					settle(store.Change{To: store.StatusQueued})
					return
				}
			}
			var halt *store.Change
			if res, halt = r.seatedAttempt(ctx, op, req, settings.MaxResult, attempt == 0); halt != nil {
				if halt.To == store.StatusFailed {
					r.queueTimeout(op)
				}
				settle(*halt)
				return
			}
		}
		if res.Panicked != nil {
			log.Error("a handler panicked serving the operation", zap.Any("panic", res.Panicked), zap.ByteString("stack", res.Stack))
		}
		change, retry := outcome(ctx, parent, res, retryOn)
		if (change.To == store.StatusCanceled || change.To == store.StatusFailed) && change.Result == nil && res.Cut != nil {
			// A background response keeps what its cut attempt streamed: its replay then
			// numbers the events, and the final one, as its live stream did (docs/responses.md).
			change.Result = res.Cut
		}
		if retry && attempt < settings.Retries {
			if !r.backoff(ctx, attempt, res) {
				if ctx.Err() != nil {
					change, _ = outcome(ctx, parent, Result{}, retryOn)
				}
			} else {
				r.hooks.Retried()
				if _, err := r.st.RecordAttempt(op.ID); err != nil {
					log.Warn("counting an attempt", zap.Error(err))
				}
				continue
			}
		}
		settle(change)
		return
	}
}

// backoff waits before the next attempt, at least as long as the upstream's Retry-After asks
// when that fits in what is left of the timeout; false when the execution ended meanwhile, or
// the wait would outlast it (the attempt's failure then stands).
func (r *Runner) backoff(ctx context.Context, attempt int, res Result) bool {
	var retryAfter time.Duration
	if res.Header != nil {
		retryAfter = webhook.ParseRetryAfter(res.Header.Get("Retry-After"), r.clock.Now())
	}
	wait := max(webhook.Backoff(retryBase, retryCap, attempt, 0), retryAfter)
	if dl, ok := ctx.Deadline(); ok && r.clock.Now().Add(wait).After(dl) {
		if retryAfter > 0 {
			return false
		}
		wait = r.clock.Until(dl)
	}
	t := r.clock.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.Chan():
		return true
	case <-ctx.Done():
		return false
	}
}

// outcome maps an attempt to the operation's next step (docs/api.md, Outcomes), and
// whether the attempt may be retried: a connection error always, a status when retryOn has
// it. A zero Change.To means nothing is to be written: the operation was lost to another
// worker.
func outcome(ctx, parent context.Context, res Result, retryOn map[int]bool) (store.Change, bool) {
	var result *store.Response
	if res.Status != 0 && !res.Over {
		result = &store.Response{Status: res.Status, Header: res.Header, Body: res.Body}
	}
	failed := func(code apierr.Code, msg string) store.Change {
		return store.Change{To: store.StatusFailed, Error: apierr.Failure(code, msg), Result: result}
	}
	switch cause := context.Cause(parent); {
	case errors.Is(cause, errLeaseLost):
		return store.Change{}, false
	case errors.Is(cause, errCanceledByUser):
		return store.Change{To: store.StatusCanceled}, false
	case errors.Is(cause, errRunnerStopping):
		return store.Change{To: store.StatusQueued}, false
	}
	switch {
	case res.Panicked != nil:
		return failed(apierr.CodeUpstreamError, "A handler of the route failed while serving the operation."), false
	case res.Over:
		return failed(apierr.CodeResultTooLarge, "The upstream response was larger than max_result."), false
	case errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return failed(apierr.CodeOperationTimeout, "The upstream call did not finish within the operation timeout."), false
	case res.Status == 0:
		return failed(apierr.CodeUpstreamUnavailable, "The upstream could not be reached."), true
	case res.Status >= 200 && res.Status < 300:
		return store.Change{To: store.StatusSucceeded, Result: result}, false
	}
	msg := fmt.Sprintf("The upstream answered %d.", res.Status)
	switch retry := retryOn[res.Status]; {
	case res.Status == 408 || res.Status == 429 || res.Status == 502 || res.Status == 503 || res.Status == 504:
		return failed(apierr.CodeUpstreamUnavailable, msg), retry
	case res.Status >= 500:
		return failed(apierr.CodeUpstreamError, msg), retry
	default:
		return failed(apierr.CodeUpstreamRejected, msg), retry
	}
}

// Retrying a final transition the storage refused: the execution keeps its lease (the
// heartbeat renews it) while it tries, and past finishRetryFor lets it lapse, so a takeover
// settles the operation by on_crash; it never stays running for good (docs/operating.md).
const (
	finishRetryBase = 100 * time.Millisecond
	finishRetryMax  = 5 * time.Second
	finishRetryFor  = 2 * time.Minute
)

// finish applies the final change (or the hand-back to the queue), fenced to this worker.
func (r *Runner) finish(parent context.Context, id string, change store.Change, log *zap.Logger) {
	if change.To == "" {
		log.Warn("operation lost to another worker; its outcome here is dropped")
		return
	}
	change.Holder = r.worker
	if change.To == store.StatusQueued {
		if op, err := r.st.GetOperation(id); err == nil && !op.CancelRequestedAt.IsZero() {
			change.To = store.StatusCanceled
		}
	}
	giveUp := r.clock.Now().Add(finishRetryFor)
	for wait := finishRetryBase; ; wait = min(wait*2, finishRetryMax) {
		op, err := r.st.Transition(id, change)
		switch {
		case err == nil:
			r.finished(op, log)
			return
		case errors.Is(err, store.ErrNotHolder), errors.Is(err, store.ErrIllegalTransition), errors.Is(err, store.ErrNotFound):
			log.Warn("operation settled elsewhere; its outcome here is dropped", zap.String("new_status", string(change.To)), zap.Error(err))
			return
		case errors.Is(context.Cause(parent), errLeaseLost) || errors.Is(context.Cause(parent), errRunnerStopping) || r.clock.Now().After(giveUp):
			// A stopping gateway past its grace period leaves the rest to a takeover, as a
			// crash would, rather than hold the stop (docs/operating.md).
			log.Error("recording the operation's outcome failed; leaving it to a takeover", zap.String("new_status", string(change.To)), zap.Error(err))
			return
		}
		log.Warn("recording the operation's outcome; retrying", zap.String("new_status", string(change.To)), zap.Duration("retry_in", wait), zap.Error(err))
		r.clock.Sleep(wait)
	}
}

func (r *Runner) finished(op *store.Operation, log *zap.Logger) {
	r.streams.settled() // followers waiting for the outcome of an attempt whose stream ended
	if op.Status == store.StatusQueued {
		r.countMoved(op, 1)
	} else {
		r.hooks.Settled(op)
	}
	r.courier.Kick()
	fields := []zap.Field{zap.String("old_status", string(store.StatusRunning)), zap.String("new_status", string(op.Status)), zap.Int("attempts", op.Attempts)}
	if !op.FinishedAt.IsZero() && !op.StartedAt.IsZero() {
		fields = append(fields, zap.Duration("duration", op.FinishedAt.Sub(op.StartedAt)))
	}
	if op.Error != nil {
		fields = append(fields, zap.String("error_code", op.Error.Code))
	}
	log.Info("operation transition", fields...)
}

// attempt sends the stored request once through the current config's dispatch (the server
// that accepted it), and records the answer.
func (r *Runner) attempt(ctx context.Context, op *store.Operation, req *store.Request, limit int64) Result {
	srv := r.handlerFor(op)
	if srv == nil {
		return Result{}
	}
	hr, err := http.NewRequestWithContext(context.WithValue(ctx, execKey{}, op.ID), req.Method, req.URL, bytes.NewReader(req.Body))
	if err != nil {
		return Result{}
	}
	hr.RequestURI, hr.Host, hr.RemoteAddr = req.URL, req.Host, req.RemoteAddr
	hr.Header = req.Header.Clone()
	tracing.Inject(hr)
	hr.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(req.Body)), nil }
	rec := capture.NewBuffer(limit)
	stream := r.streams.start(op.ID, r.recordingFor(ctx, op.ID))
	rec.Stream = stream
	res := ServeRecorded(rec, func() error { srv.ServeHTTP(rec, hr); return nil })
	r.streams.end(op.ID, stream, res.Status != 0 && !res.Over)
	if (res.Status == 0 || res.Over) && res.Panicked == nil && op.Kind == responses.Kind && stream.Started() {
		status, header := stream.Head()
		res.Cut = &store.Response{Status: status, Header: header.Clone(), Body: stream.Relayed()}
	}
	return res
}

// ServeRecorded runs serve into rec. The proxy aborts a response it cannot finish writing
// (rec past max_result, or the call canceled) with http.ErrAbortHandler, which net/http would
// recover on a real connection; here it means the attempt ended without a whole response. Any
// other panic is this goroutine's, with no net/http above it to recover it: it becomes a failed
// attempt, never a dead process.
func ServeRecorded(rec *capture.Buffer, serve func() error) (res Result) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				res = Result{Panicked: v, Stack: debug.Stack()}
				return
			}
			res = ResultOf(rec.Result())
			if !res.Over {
				res = Result{}
			}
		}
	}()
	if err := serve(); err != nil {
		return Result{}
	}
	return ResultOf(rec.Result())
}

package module

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/webhook"
)

// execKey marks a request the runner sends through the server: the mulligan handler passes it
// straight to the rest of its route.
type execKey struct{}

// attemptResult is what one upstream attempt produced.
type attemptResult struct {
	status int // 0: no response (transport error or cancellation)
	header http.Header
	body   []byte
	over   bool // the response passed max_result
}

// Retry pacing of upstream attempts: exponential with full jitter, honouring Retry-After.
const (
	retryBase = 250 * time.Millisecond
	retryCap  = 10 * time.Second
)

// execute runs op to a final status (or back to the queue when the gateway stops), retrying as
// the outcome table says.
func (r *runner) execute(parent context.Context, op *store.Operation, first <-chan attemptResult) {
	cfg := r.config()
	ctx, cancel := context.WithTimeout(parent, time.Duration(cfg.Timeout))
	defer cancel()
	log := r.log.With(zap.String("operation_id", op.ID))
	if first == nil {
		metrics.queueWait.Observe(op.StartedAt.Sub(op.SubmittedAt).Seconds())
	}
	req, err := r.st.LoadRequest(op.ID)
	if err != nil {
		log.Error("loading the operation's request", zap.Error(err))
		r.finish(op.ID, store.Change{To: store.StatusFailed, Error: catalogueError(CodeWorkerLost, "The stored request could not be read.")}, log)
		return
	}
	for attempt := 0; ; attempt++ {
		var res attemptResult
		if attempt == 0 && first != nil {
			res = <-first
		} else {
			res = r.attempt(ctx, op, req, cfg.MaxResult)
		}
		change, retry := outcome(ctx, parent, res)
		if retry && attempt < *cfg.Retries {
			if !r.backoff(ctx, attempt, res) {
				change, _ = outcome(ctx, parent, attemptResult{})
			} else {
				metrics.retries.Inc()
				if _, err := r.st.RecordAttempt(op.ID); err != nil {
					log.Warn("counting an attempt", zap.Error(err))
				}
				continue
			}
		}
		r.finish(op.ID, change, log)
		return
	}
}

// backoff waits before the next attempt; false when the execution ended meanwhile.
func (r *runner) backoff(ctx context.Context, attempt int, res attemptResult) bool {
	var retryAfter time.Duration
	if res.header != nil {
		retryAfter = webhook.ParseRetryAfter(res.header.Get("Retry-After"), time.Now())
	}
	t := time.NewTimer(webhook.Backoff(retryBase, retryCap, attempt, min(retryAfter, retryCap)))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// outcome maps an attempt to the operation's next step (docs/api.md, Outcomes), and whether
// the attempt may be retried.
func outcome(ctx, parent context.Context, res attemptResult) (store.Change, bool) {
	var result *store.Response
	if res.status != 0 && !res.over {
		result = &store.Response{Status: res.status, Header: res.header, Body: res.body}
	}
	failed := func(code ErrorCode, msg string) store.Change {
		return store.Change{To: store.StatusFailed, Error: catalogueError(code, msg), Result: result}
	}
	switch cause := context.Cause(parent); {
	case errors.Is(cause, errCanceledByUser):
		return store.Change{To: store.StatusCanceled}, false
	case errors.Is(cause, errRunnerStopping):
		return store.Change{To: store.StatusQueued}, false
	}
	switch {
	case res.over:
		return failed(CodeResultTooLarge, "The upstream response was larger than max_result."), false
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return failed(CodeOperationTimeout, "The upstream call did not finish within the operation timeout."), false
	case res.status == 0:
		return failed(CodeUpstreamUnavailable, "The upstream could not be reached."), true
	case res.status >= 200 && res.status < 300:
		return store.Change{To: store.StatusSucceeded, Result: result}, false
	case res.status == 408 || res.status == 429 || res.status == 502 || res.status == 503 || res.status == 504:
		return failed(CodeUpstreamUnavailable, fmt.Sprintf("The upstream answered %d.", res.status)), true
	case res.status >= 500:
		return failed(CodeUpstreamError, fmt.Sprintf("The upstream answered %d.", res.status)), false
	default:
		return failed(CodeUpstreamRejected, fmt.Sprintf("The upstream answered %d.", res.status)), false
	}
}

// finish applies the final change (or the hand-back to the queue).
func (r *runner) finish(id string, change store.Change, log *zap.Logger) {
	if change.To == store.StatusQueued {
		if op, err := r.st.GetOperation(id); err == nil && !op.CancelRequestedAt.IsZero() {
			change = store.Change{To: store.StatusCanceled}
		}
	}
	op, err := r.st.Transition(id, change)
	if err != nil {
		log.Error("recording the operation's outcome", zap.String("new_status", string(change.To)), zap.Error(err))
		return
	}
	if change.To == store.StatusQueued {
		r.queued.Add(1)
	} else {
		countFinal(op)
	}
	r.courier.kick()
	fields := []zap.Field{zap.String("old_status", string(store.StatusRunning)), zap.String("new_status", string(op.Status)), zap.Int("attempts", op.Attempts)}
	if !op.FinishedAt.IsZero() && !op.StartedAt.IsZero() {
		fields = append(fields, zap.Duration("duration", op.FinishedAt.Sub(op.StartedAt)))
	}
	if op.Error != nil {
		fields = append(fields, zap.String("error_code", op.Error.Code))
	}
	log.Info("operation transition", fields...)
}

// attempt sends the stored request once through the current config's server that accepted
// it, and records the answer.
func (r *runner) attempt(ctx context.Context, op *store.Operation, req *store.Request, limit int64) attemptResult {
	srv := r.server(op.Server)
	if srv == nil {
		return attemptResult{}
	}
	hr, err := http.NewRequestWithContext(context.WithValue(ctx, execKey{}, op.ID), req.Method, req.URL, bytes.NewReader(req.Body))
	if err != nil {
		return attemptResult{}
	}
	hr.RequestURI, hr.Host, hr.RemoteAddr = req.URL, req.Host, req.RemoteAddr
	hr.Header = req.Header.Clone()
	hr.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(req.Body)), nil }
	rec := newBufferWriter(limit)
	return serveRecorded(rec, func() error { srv.ServeHTTP(rec, hr); return nil })
}

// serveRecorded runs serve into rec. The proxy aborts a response it cannot finish writing
// (rec past max_result, or the call canceled) with http.ErrAbortHandler, which net/http would
// recover on a real connection; here it means the attempt ended without a whole response.
func serveRecorded(rec *bufferWriter, serve func() error) (res attemptResult) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			res = rec.result()
			if !res.over {
				res = attemptResult{}
			}
		}
	}()
	if err := serve(); err != nil {
		return attemptResult{}
	}
	return rec.result()
}

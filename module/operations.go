package module

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/idemkey"
	"github.com/mulligan-gw/mulligan/internal/opview"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/internal/sse"
	"github.com/mulligan-gw/mulligan/store"
)

// cancelWait is how long a cancel request waits for a running call to stop before answering
// 202 with cancel_requested_at (docs/api.md, Operations API).
const cancelWait = 2 * time.Second

// opsRequest is one call of the operations API, already matched to the caller's scope.
type opsRequest struct {
	w   http.ResponseWriter
	r   *http.Request
	st  store.Backend
	run *runner.Runner
	// caller: an anonymous one (no credentials) lists nothing, so callers without credentials
	// never see each other's operations.
	caller
	log reqLog
}

// serveOperations routes the operations API:
//
//	GET    {prefix}                 the caller's operations, newest first
//	GET    {prefix}/{id}            one operation
//	GET    {prefix}/{id}/result     its upstream response, as sent
//	POST   {prefix}/{id}/cancel     cancel it (also DELETE {prefix}/{id})
func (h *Handler) serveOperations(w http.ResponseWriter, r *http.Request, st store.Backend, run *runner.Runner, who caller, log reqLog) {
	q := &opsRequest{w: w, r: r, st: st, run: run, caller: who, log: log}
	rest := strings.Trim(strings.TrimPrefix(r.URL.Path, h.conv.prefix), "/")
	id, action, _ := strings.Cut(rest, "/")
	switch {
	case id == "" && r.Method == http.MethodGet:
		h.listOperations(q)
	case id == "":
		methodNotAllowed(w, "GET")
	case action == "" && r.Method == http.MethodGet:
		h.getOperation(q, id)
	case action == "" && r.Method == http.MethodDelete, action == "cancel" && r.Method == http.MethodPost:
		h.cancelOperation(q, id)
	case action == "result" && r.Method == http.MethodGet:
		h.getResult(q, id)
	case action == "":
		methodNotAllowed(w, "GET, DELETE")
	case action == "cancel":
		methodNotAllowed(w, "POST")
	case action == "result":
		methodNotAllowed(w, "GET")
	default:
		notFound(w, id)
	}
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	apierr.Write(w, apierr.Error{Code: apierr.CodeMethodNotAllowed, Message: "Use " + allow + " here."})
}

func notFound(w http.ResponseWriter, id string) {
	apierr.Write(w, apierr.Error{Code: apierr.CodeOperationNotFound, Message: "No operation " + id + "."})
}

// load returns the operation if it exists in the caller's scope; otherwise it answers 404,
// the same for another scope's operation as for a missing one.
func (q *opsRequest) load(id string) *store.Operation {
	op, err := q.st.GetOperation(id)
	if err == nil && op.Scope == q.scope {
		var gone bool
		if gone, err = responseDeleted(q.st, op); err == nil && gone {
			err = store.ErrNotFound // a deleted background response (docs/responses.md)
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && op.Scope != q.scope):
		notFound(q.w, id)
		return nil
	case err != nil:
		q.fail(err)
		return nil
	}
	return op
}

func (q *opsRequest) fail(err error) {
	q.log.Error("storage unavailable", zap.Error(err))
	apierr.Write(q.w, apierr.Error{Code: apierr.CodeStorage, Message: "The gateway's storage is unavailable; retry shortly.", RetryAfter: time.Second})
}

func (h *Handler) getOperation(q *opsRequest, id string) {
	metrics.polls.Inc()
	op := q.load(id)
	if op == nil {
		return
	}
	h.writeOperation(q, http.StatusOK, op)
}

// writeOperation answers op's view, its inline JSON result loaded when there is one to show.
func (h *Handler) writeOperation(q *opsRequest, status int, op *store.Operation) {
	now := h.now()
	var result *store.Response
	if cur := op.As(now); cur.Result != nil && cur.Result.Size <= opview.InlineBodyLimit {
		if res, err := q.st.LoadResult(op.ID); err == nil {
			result = res
		}
	}
	if !op.Status.Final() {
		q.w.Header().Set("Retry-After", apierr.RetryAfterValue(opview.PollAfter))
	}
	v := opview.Of(h.conv.prefix, op, result, now)
	v.QueuePosition = queuePosition(q.st, op)
	if !op.Status.Final() { // docs/streams.md
		if s := q.run.StreamOf(op.ID); s != nil {
			v.Progress = progressOf(s)
		} else {
			v.Progress = storedProgress(q.run, op)
		}
	}
	writeJSON(q.w, status, v)
}

// testHookFollowerAwaited, when set by a test, runs when a follower of an operation's result
// has waited for its answer to begin and is about to be served.
var testHookFollowerAwaited func()

func (h *Handler) getResult(q *opsRequest, id string) {
	op := q.load(id)
	if op == nil {
		return
	}
	cur := op.As(h.now())
	if sse.WantsEventStream(q.r) {
		// A follower of a job it just submitted waits for the answer to begin, not 409; one
		// whose stream ended as it looked (the final status not yet written) waits on for it.
		deadline := h.now().Add(streamWaitMax)
		for {
			if h.followResult(q, cur) {
				return
			}
			if cur.Status.Final() {
				break
			}
			next, look := h.awaitAnswer(q, cur, deadline)
			if next == nil {
				return // the client left
			}
			if cur = next; !look {
				break
			}
			if testHookFollowerAwaited != nil {
				testHookFollowerAwaited()
			}
		}
	}
	if !cur.Status.Final() {
		apierr.Write(q.w, apierr.Error{Code: apierr.CodeNotFinished, RetryAfter: opview.PollAfter, Details: map[string]any{"operation_id": id},
			Message: "The operation is " + string(cur.Status) + "; its result is not there yet."})
		return
	}
	res, err := q.st.LoadResult(id)
	if errors.Is(err, store.ErrNotFound) || cur.Result == nil {
		apierr.Write(q.w, apierr.Error{Code: apierr.CodeOperationNotFound, Details: map[string]any{"status": cur.Status},
			Message: "Operation " + id + " has no upstream response (it is " + string(cur.Status) + ")."})
		return
	}
	if err != nil {
		q.fail(err)
		return
	}
	capture.WriteResponse(q.w, *res)
}

func (h *Handler) listOperations(q *opsRequest) {
	v := q.r.URL.Query()
	status := store.Status(v.Get("status"))
	if status != "" && !status.Valid() {
		apierr.Write(q.w, apierr.Error{Code: apierr.CodeInvalidRequest, Message: "status must be one of queued, running, succeeded, failed, canceled, expired."})
		return
	}
	limit := 50
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			apierr.Write(q.w, apierr.Error{Code: apierr.CodeInvalidRequest, Message: "limit must be a whole number from 1 to 100."})
			return
		}
		limit = n
	}
	list := q.st.ListOperations
	if v.Has("idempotency_key") {
		key, err := idemkey.Parse(v.Get("idempotency_key"))
		if err != nil {
			apierr.Write(q.w, apierr.Error{Code: apierr.CodeInvalidRequest, Message: err.Error() + "; send 1 to 255 printable ASCII characters in idempotency_key."})
			return
		}
		list = withKey(list, key)
	}
	var ops []*store.Operation
	var next string
	if !q.anonymous {
		var err error
		if ops, next, err = list(q.scope, status, v.Get("after"), limit); err != nil {
			q.fail(err)
			return
		}
	}
	now := h.now()
	out := struct {
		Operations []opview.View `json:"operations"`
		NextAfter  string        `json:"next_after,omitempty"`
	}{Operations: make([]opview.View, 0, len(ops)), NextAfter: next}
	for _, op := range ops {
		gone, err := responseDeleted(q.st, op)
		if err != nil {
			q.fail(err)
			return
		}
		if !gone {
			out.Operations = append(out.Operations, opview.Of(h.conv.prefix, op, nil, now))
		}
	}
	writeJSON(q.w, http.StatusOK, out)
}

// cancelOperation cancels a queued operation at once, or stops a running one's upstream call
// (closing the connection to the model server), answering 202 if it has not stopped in 2s.
func (h *Handler) cancelOperation(q *opsRequest, id string) {
	op := q.load(id)
	if op == nil {
		return
	}
	if op.Status == store.StatusQueued {
		canceled, err := q.run.CancelQueued(op, q.log)
		if err == nil {
			h.writeOperation(q, http.StatusOK, canceled)
			return
		}
		if !errors.Is(err, store.ErrIllegalTransition) {
			q.fail(err)
			return
		}
		// It started meanwhile: cancel it as a running one.
	}
	if op.As(h.now()).Status.Final() {
		h.alreadyFinal(q, op)
		return
	}
	asked, err := q.st.RequestCancel(id, h.now())
	if err != nil {
		q.fail(err)
		return
	}
	if asked.Status.Final() { // it ended before the cancel was recorded
		h.alreadyFinal(q, asked)
		return
	}
	op, err = h.awaitCancel(q, id)
	if err != nil {
		q.fail(err)
		return
	}
	switch {
	case op.Status == store.StatusCanceled:
		h.writeOperation(q, http.StatusOK, op)
	case op.Status.Final(): // it finished on its own while the cancel was on its way
		h.alreadyFinal(q, op)
	default:
		h.writeOperation(q, http.StatusAccepted, op)
	}
}

// alreadyFinal answers a cancel of an operation that ended without it.
func (h *Handler) alreadyFinal(q *opsRequest, op *store.Operation) {
	st := op.As(h.now()).Status
	apierr.Write(q.w, apierr.Error{Code: apierr.CodeAlreadyFinal, Details: map[string]any{"status": st},
		Message: "The operation is already " + string(st) + "."})
}

// awaitCancel stops id's execution and waits up to cancelWait for it to become final.
func (h *Handler) awaitCancel(q *opsRequest, id string) (*store.Operation, error) {
	deadline := h.clock.NewTimer(cancelWait)
	defer deadline.Stop()
	for {
		done := q.run.Cancel(id)
		if done != nil {
			select {
			case <-done:
			case <-deadline.Chan():
			}
			return q.st.GetOperation(id)
		}
		// Not executing here (another replica runs it and stops it at its next lease renewal,
		// or it is between claim and start): look again shortly.
		op, err := q.st.GetOperation(id)
		if err != nil || op.Status.Final() {
			return op, err
		}
		select {
		case <-deadline.Chan():
			return op, nil
		case <-h.clock.After(20 * time.Millisecond):
		}
	}
}

// writeJSON writes v with status; the one encoder for the operations API.
func writeJSON(w http.ResponseWriter, status int, v any) { apierr.WriteJSON(w, status, v) }

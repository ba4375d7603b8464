package module

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/internal/idemkey"
	"github.com/mulligan-gw/mulligan/internal/responses"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/store"
)

// The Responses API's background mode (docs/responses.md): a background response is an
// operation of kind "response", run by the operations engine like any other; this file maps
// OpenAI's endpoints and objects onto it.

// respCall is one call of the Responses API, matched to the caller's scope.
type respCall struct {
	h   *Handler
	w   http.ResponseWriter
	r   *http.Request
	st  store.Backend
	run *runner.Runner
	caller
	now time.Time
	log reqLog
	rd  *responses.Reader // reads its responses' objects and streams through it: reader()
}

// serveResponses serves the Responses API under the block's prefix and reports whether it
// answered; a create without background true is not its own, and goes on through the gate
// to the upstream untouched:
//
//	POST   {prefix}/responses              create (background true: stored, answered queued)
//	GET    {prefix}/responses/{id}         the response (?stream=true&starting_after=N: its events)
//	POST   {prefix}/responses/{id}/cancel  cancel it
//	DELETE {prefix}/responses/{id}         delete it
func (h *Handler) serveResponses(w http.ResponseWriter, r *http.Request) bool {
	rest := strings.TrimPrefix(r.URL.Path, h.Responses.path())
	if rest == "" && r.Method != http.MethodPost {
		return false
	}
	s, done, err := h.storage.acquire()
	if err != nil {
		h.storageFailed(w, err)
		return true
	}
	defer done()
	a := &respCall{h: h, w: w, r: r, st: s.be, run: s.run, caller: h.callerOf(r), now: h.now(),
		log: newReqLog(h.logger, zap.String("request_id", w.Header().Get(headerRequestID)))}
	if rest == "" {
		return a.create()
	}
	a.route().Serve(strings.TrimPrefix(rest, "/"))
	return true
}

// create takes a request with background true as a queued operation: stored, with the body
// the upstream will get (background dropped, stream forced), before the answer, which is the
// response object, queued, or with stream true its events as they come.
func (a *respCall) create() bool {
	h := a.h
	if a.r.ContentLength > h.gate.maxBody {
		// Too large to store as a response: it goes on as it would without the block (the
		// gate refuses it with a key; a background one the upstream refuses).
		return false
	}
	key, ok := h.gate.keyOf(a.w, a.r)
	if !ok {
		return true
	}
	kr, err := h.gate.prepare(a.w, a.r, h.bodies, key, h.scopeOf(a.r), a.log)
	if errors.Is(err, errAnswered) {
		return true
	}
	if err != nil {
		a.route().Invalid("The request body could not be read.", "")
		return true
	}
	c, err := responses.ParseCreate(kr.body)
	var fe *responses.FieldError
	switch {
	case errors.As(err, &fe):
		h.bodies.give(kr.reserved)
		a.route().Invalid(fe.Message, fe.Param)
		return true
	case err != nil:
		h.bodies.give(kr.reserved)
		a.route().Invalid("We could not parse the JSON body of your request: it must be a JSON object.", "")
		return true
	case !c.Background:
		h.bodies.give(kr.reserved)
		setBody(a.r, kr.body) // as it came, for the gate and the upstream
		return false
	}
	defer h.bodies.give(kr.reserved)
	if !h.conv.describe(a.w, kr) {
		return true
	}
	op := a.newResponse(kr, c)
	req := storedRequest(kr)
	req.Body = c.Upstream
	req.Header.Del("Content-Length")
	req.Header.Set("Content-Type", "application/json")
	if c.Stream {
		kr.replayed = a.replayStream
	}
	resp, ok, _ := h.conv.enqueue(a.w, kr, a.st, a.run, op, req, a.createdAnswer)
	if !ok {
		return true // answered already: a full queue or scope, a key's record, the storage failing
	}
	a.log.Info("background response accepted", zap.String("response_id", op.ID))
	if c.Stream {
		a.route().Follow(op, -1)
		return true
	}
	writeStored(a.w, resp)
	return true
}

// replayStream answers a retried create with stream true, whose key's record holds the
// response created first, with that response's events, as the first create answered; false
// when the record names no response of the caller's (it is then answered as recorded).
func (a *respCall) replayStream(claim store.Claim) bool {
	if claim.Record == nil || claim.Record.OperationID == "" {
		return false
	}
	op, err := a.st.GetOperation(claim.Record.OperationID)
	if err != nil || op.Scope != a.scope || op.Kind != responses.Kind || op.As(a.now).Status == store.StatusExpired {
		return false
	}
	countRequest(outcomeReplayed)
	a.route().Follow(op, -1)
	return true
}

// newResponse is the operation a background response becomes, not stored yet: the block's
// retention, urgency, timeout and max_result, and webhooks in OpenAI's format when it has a
// callback.
func (a *respCall) newResponse(kr *keyedRequest, c responses.Create) *store.Operation {
	cfg := a.h.Responses
	op := a.h.conv.newOperation(kr, store.StatusQueued)
	op.ID, op.Kind, op.Echo, op.Type = newID("resp_", op.SubmittedAt), responses.Kind, c.Echo, cfg.path()
	op.Retention = time.Duration(cfg.Retention)
	if cfg.Urgency != nil && !a.trustedUrgency(kr, op.SubmittedAt) {
		// The operator's, which an untrusted caller's Priority may lower, never raise (a
		// trusted class's urgency is newOperation's, as for any operation).
		op.Urgency, op.Lift = max(*cfg.Urgency, op.Urgency), 0
		if p := kr.r.Header.Values("Priority"); len(p) == 0 {
			op.Urgency = *cfg.Urgency
		} else {
			op.Lift = max(op.Urgency-capacity.UrgencyOf(p), 0) // what it asked, for its own work
		}
	}
	op.Exec.Timeout, op.Exec.MaxResult = time.Duration(cfg.Timeout), cfg.MaxResult
	op.Exec.Events = nil
	if op.Callback != nil {
		op.Exec.Events = responses.WebhookTypes
	}
	return op
}

// trustedUrgency reports whether the create's urgency is a trusted class's (docs/capacity.md).
func (a *respCall) trustedUrgency(kr *keyedRequest, now time.Time) bool {
	c := a.h.conv.capacity
	return c != nil && c.ask(kr.r, kr.scope, now).Trusted
}

// createdAnswer is the answer to a create, as sent and recorded for its key: the response
// object, queued.
func (a *respCall) createdAnswer(op *store.Operation, expires time.Time) store.Response {
	body := jsonBody(responses.Base(op.ID, op.SubmittedAt.Unix(), responses.Queued, op.Echo))
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if !expires.IsZero() {
		h.Set(headerExpires, expires.UTC().Format(http.TimeFormat))
	}
	return store.Response{Status: http.StatusOK, Header: h, Body: body}
}

// errBusy: reading a finished response's recorded answer would pass the block's budget of
// bytes held in memory (max_buffered); the client retries shortly (503 GATEWAY_BUSY).
var errBusy = errors.New("the gateway holds its max_buffered in memory")

// LoadResult loads op's recorded answer (nil when it has none), with times its size reserved
// from the bytes the block holds in memory at once (max_buffered, shared with request bodies),
// so that polls and replays of large answers at once are bounded; release gives it back. It
// fails errBusy when the reservation does not fit.
func (a *respCall) LoadResult(op *store.Operation, times int64) (res *store.Response, release func(), err error) {
	release = func() {}
	if op.Result == nil {
		return nil, release, nil
	}
	// An answer larger than the whole budget takes all of it: it is read when nothing else is
	// held, rather than never.
	n := min(times*int64(op.Result.Size), a.h.bodies.limit)
	if !a.h.bodies.take(n) {
		return nil, release, errBusy
	}
	if res, err = a.st.LoadResult(op.ID); err != nil {
		a.h.bodies.give(n)
		if errors.Is(err, store.ErrNotFound) {
			return nil, release, nil
		}
		return nil, release, err
	}
	return res, func() { a.h.bodies.give(n) }, nil
}

// route is the call's routes on a stored response (internal/responses), reading and cancelling
// through a.
func (a *respCall) route() *responses.Call {
	return &responses.Call{W: a.w, R: a.r, St: a.st, Scope: a.scope, Now: a.now, Host: a, Reader: a.reader(), Log: a.log}
}

// Timeout is how long an attempt of op may run.
func (a *respCall) Timeout(op *store.Operation) time.Duration { return execOf(op).Timeout }

// CreateKey is the record key of op's create under its Idempotency-Key.
func (a *respCall) CreateKey(op *store.Operation) []byte {
	return idemkey.Record(a.h.scopeOf(a.r), op.Method, op.Path, op.IdempotencyKey)
}

// Stop cancels op through the operations API's own path (docs/api.md): a queued one at once,
// a running one by cutting its upstream call wherever it runs. It returns op as it then is.
func (a *respCall) Stop(op *store.Operation) (*store.Operation, error) {
	q := &opsRequest{w: a.w, r: a.r, st: a.st, run: a.run, caller: a.caller, log: a.log}
	if op.Status == store.StatusQueued {
		canceled, err := a.run.CancelQueued(op, a.log)
		if err == nil {
			return canceled, nil
		}
		if !errors.Is(err, store.ErrIllegalTransition) {
			return nil, err
		}
	}
	if op.Status.Final() {
		return op, nil
	}
	asked, err := a.st.RequestCancel(op.ID, a.now)
	if err != nil || asked.Status.Final() {
		return asked, err
	}
	return a.h.awaitCancel(q, op.ID)
}

// responseDeleted reports whether op is a background response that was deleted
// (responses.Deleted).
func responseDeleted(st store.Backend, op *store.Operation) (bool, error) {
	return responses.Deleted(st, op)
}

// Fail answers err, which kept a route from answering: 503 GATEWAY_BUSY for errBusy, else
// 503 STORAGE_UNAVAILABLE.
func (a *respCall) Fail(err error) {
	if errors.Is(err, errBusy) {
		apierr.WriteOpenAI(a.w, apierr.Error{Code: apierr.CodeBusy, RetryAfter: time.Second, Details: map[string]any{"max_buffered": a.h.bodies.limit},
			Message: "The gateway holds as many bytes of answers and bodies as it may; retry shortly."})
		return
	}
	a.log.Error("storage unavailable", zap.Error(err))
	apierr.WriteOpenAI(a.w, apierr.Error{Code: apierr.CodeStorage, Message: "The gateway's storage is unavailable; retry shortly.", RetryAfter: time.Second})
}

package module

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
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
	id, action, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
	m := r.Method
	switch {
	case id == "":
		a.notFound(r.URL.Path)
	case action == "" && m == http.MethodGet:
		a.retrieve(id)
	case action == "" && m == http.MethodDelete:
		a.delete(id)
	case action == "":
		a.notAllowed("GET, DELETE")
	case action == "cancel" && m == http.MethodPost:
		a.cancel(id)
	case action == "cancel":
		a.notAllowed("POST")
	default:
		a.openAIError(apierr.Error{Code: apierr.CodeResponseNotFound, Message: "No such route: " + r.URL.Path})
	}
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
		a.invalid("The request body could not be read.", "")
		return true
	}
	c, err := responses.ParseCreate(kr.body)
	var fe *responses.FieldError
	switch {
	case errors.As(err, &fe):
		h.bodies.give(kr.reserved)
		a.invalid(fe.Message, fe.Param)
		return true
	case err != nil:
		h.bodies.give(kr.reserved)
		a.invalid("We could not parse the JSON body of your request: it must be a JSON object.", "")
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
		a.follow(op, -1)
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
	a.follow(op, -1)
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
		op.Urgency = max(*cfg.Urgency, op.Urgency)
		if len(kr.r.Header.Values("Priority")) == 0 {
			op.Urgency = *cfg.Urgency
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

// load returns the caller's response id, or answers 404: the same for another scope's, a
// deleted one, one past its retention, and an operation that is not a response.
func (a *respCall) load(id string) *store.Operation {
	op, err := a.st.GetOperation(id)
	if err == nil && (op.Scope != a.scope || op.Kind != responses.Kind || op.As(a.now).Status == store.StatusExpired) {
		err = store.ErrNotFound
	}
	if err == nil {
		var gone bool
		if gone, err = responseDeleted(a.st, op); err == nil && gone {
			err = store.ErrNotFound
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		a.openAIError(apierr.Error{Code: apierr.CodeResponseNotFound, Param: apierr.Param("response_id"), Message: "No response with id '" + id + "' found."})
		return nil
	case err != nil:
		a.fail(err)
		return nil
	}
	return op
}

// retrieve answers the response object, or with ?stream=true its events.
func (a *respCall) retrieve(id string) {
	q := a.r.URL.Query()
	stream, err := responses.ParseStream(q["stream"])
	if err != nil {
		a.invalid(err.Error(), "stream")
		return
	}
	after, err := responses.ParseStartingAfter(q["starting_after"])
	if err != nil {
		a.invalid(err.Error(), "starting_after")
		return
	}
	op := a.load(id)
	if op == nil {
		return
	}
	if stream {
		a.follow(op, after)
		return
	}
	o, err := a.reader().Object(op)
	if err != nil {
		a.fail(err)
		return
	}
	writeJSON(a.w, http.StatusOK, o)
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

// cancel stops a queued or running response; cancelling a cancelled one answers it again,
// cancelling one that finished otherwise is 409 RESPONSE_ALREADY_FINAL. A response running on
// another replica stops at its next lease renewal; the answer waits for it a little while.
func (a *respCall) cancel(id string) {
	op := a.load(id)
	if op == nil {
		return
	}
	op, err := a.stop(op)
	if err != nil {
		a.fail(err)
		return
	}
	if op.Status.Final() && op.Status != store.StatusCanceled {
		o, err := a.reader().Object(op)
		if err != nil {
			a.fail(err)
			return
		}
		a.openAIError(apierr.Error{Code: apierr.CodeResponseAlreadyFinal, Param: apierr.Param("response_id"), Details: map[string]any{"status": o.Status()},
			Message: "Cannot cancel a response with status " + o.Status() + "."})
		return
	}
	o, err := a.reader().Object(op)
	if err != nil {
		a.fail(err)
		return
	}
	writeJSON(a.w, http.StatusOK, o)
}

// stop cancels op through the operations API's own path (docs/api.md): a queued one at once,
// a running one by cutting its upstream call wherever it runs. It returns op as it then is.
func (a *respCall) stop(op *store.Operation) (*store.Operation, error) {
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

// delete removes the response: it answers 404 from then on, on every replica and through the
// operations API too, and its create's key no longer replays it. A response still queued or
// running is cancelled first. Its stored request and answer, unreachable from then on, are
// dropped when its retention ends, as every operation's are (docs/responses.md).
func (a *respCall) delete(id string) {
	op := a.load(id)
	if op == nil {
		return
	}
	if !op.Status.Final() {
		var err error
		if op, err = a.stop(op); err != nil {
			a.fail(err)
			return
		}
	}
	key := responses.DeletedKey(op)
	claim, err := a.st.ClaimKey(key, []byte("deleted"), time.Minute)
	if err == nil && claim.Outcome == store.Claimed {
		expires := a.now.Add(op.Retention + execOf(op).Timeout + time.Hour)
		err = a.st.CompleteKey(key, claim.Token, store.Response{Status: http.StatusOK, Header: http.Header{}}, expires)
	}
	if err == nil && op.IdempotencyKey != "" {
		// The create's key no longer replays the deleted response (its object repeats the
		// request's fields): a retry with it creates a new one.
		_, err = a.st.EvictKey(idemkey.Record(a.h.scopeOf(a.r), op.Method, op.Path, op.IdempotencyKey))
	}
	if err != nil {
		a.fail(err)
		return
	}
	a.log.Info("background response deleted", zap.String("response_id", id))
	writeJSON(a.w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}

// responseDeleted reports whether op is a background response that was deleted
// (responses.Deleted).
func responseDeleted(st store.Backend, op *store.Operation) (bool, error) {
	return responses.Deleted(st, op)
}

// openAIError answers e in the error schema with OpenAI's type, as the Batches API does.
func (a *respCall) openAIError(e apierr.Error) { apierr.WriteOpenAI(a.w, e) }

func (a *respCall) invalid(message, p string) {
	a.openAIError(apierr.Error{Code: apierr.CodeInvalidRequest, Message: message, Param: apierr.Param(p)})
}

func (a *respCall) notFound(path string) {
	a.openAIError(apierr.Error{Code: apierr.CodeResponseNotFound, Message: "No such route: " + path})
}

func (a *respCall) notAllowed(allow string) {
	a.w.Header().Set("Allow", allow)
	a.openAIError(apierr.Error{Code: apierr.CodeMethodNotAllowed, Message: "Use " + allow + " here."})
}

func (a *respCall) fail(err error) {
	if errors.Is(err, errBusy) {
		a.openAIError(apierr.Error{Code: apierr.CodeBusy, RetryAfter: time.Second, Details: map[string]any{"max_buffered": a.h.bodies.limit},
			Message: "The gateway holds as many bytes of answers and bodies as it may; retry shortly."})
		return
	}
	a.log.Error("storage unavailable", zap.Error(err))
	a.openAIError(apierr.Error{Code: apierr.CodeStorage, Message: "The gateway's storage is unavailable; retry shortly.", RetryAfter: time.Second})
}

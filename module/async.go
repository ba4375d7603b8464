package module

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/opview"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/internal/tracing"
	"github.com/mulligan-gw/mulligan/store"
)

var errUpstreamUnreachable = errors.New("the upstream could not be reached")

// converter turns covered requests into operations (docs/api.md, Async operations).
type converter struct {
	cfg      *AsyncConfig
	prefix   string        // where operations are served
	webhooks *webhookSetup // nil without webhooks
	gate     *gate
	calls    slots      // `after`-mode calls under way, bounded by concurrency
	quota    *admission // nil unless max_per_scope is set
	clock    clockwork.Clock
	// capacity is the block's capacity settings (nil without): queue deadlines.
	capacity *CapacityConfig
}

// headerCallback names the endpoint URL a request wants its operation's events sent to.
const headerCallback = "Callback-Url"

// callbackFor resolves the request's callback URL (the Callback-Url header, or the body's
// callback.url), or the site's default endpoint. A URL that matches no configured endpoint is
// refused with 422 before anything is stored; so is a header and a body naming different URLs,
// with 400, rather than guess which one the client meant.
func (c *converter) callbackFor(w http.ResponseWriter, r *http.Request, bodyURL string) (*store.Callback, bool) {
	raw := r.Header.Get(headerCallback)
	if raw != "" && bodyURL != "" && raw != bodyURL {
		apierr.Write(w, apierr.Error{Code: apierr.CodeInvalidRequest, Details: map[string]any{"callback_url": raw, "body_callback_url": bodyURL},
			Message: "The Callback-Url header and the body's callback.url name different URLs; send one of them."})
		return nil, false
	}
	if raw == "" {
		raw = bodyURL
	}
	if c.webhooks == nil {
		if raw == "" {
			return nil, true
		}
	} else if ep, target, ok := c.webhooks.CallbackFor(raw); ok {
		if ep == nil {
			return nil, true
		}
		return &store.Callback{Endpoint: ep.Name, URL: target}, true
	}
	apierr.Write(w, apierr.Error{Code: apierr.CodeCallbackNotAllow, Details: map[string]any{"callback_url": raw},
		Message: "The callback URL matches no configured webhook endpoint."})
	return nil, false
}

// newOperation is the operation a request becomes, not stored yet.
func (c *converter) newOperation(kr *keyedRequest, status store.Status) *store.Operation {
	now := c.clock.Now()
	op := &store.Operation{
		ID: newID("op_", now), Scope: kr.scope, Status: status, Version: 1,
		Method: kr.r.Method, Path: kr.r.URL.Path, IdempotencyKey: kr.key, SubmittedAt: now, UpdatedAt: now,
		Retention: time.Duration(c.cfg.Retention), Type: c.cfg.Type, Metadata: kr.metadata,
		Traceparent: kr.trace.Parent, Tracestate: kr.trace.State,
		QueueDeadline: queueDeadline(c.capacity, kr.r, now),
	}
	op.Urgency, op.Lift, op.FairKey, op.Weight = c.queueAsk(kr, now)
	if op.Type == "" {
		op.Type = op.Path
	}
	if srv, ok := kr.r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		op.Server = serverID(srv)
	}
	if status == store.StatusRunning {
		op.StartedAt, op.Attempts = now, 1
	}
	op.Callback = kr.callback
	op.Exec = c.execution()
	return op
}

// execution is how this block's operations run, stored with each so that every reload,
// restart and replica honours it (docs/caddyfile.md).
func (c *converter) execution() *store.Execution {
	ex := &store.Execution{Timeout: time.Duration(c.cfg.Timeout), Retries: *c.cfg.Retries, RetryOn: c.cfg.RetryOn,
		MaxResult: c.cfg.MaxResult, OnCrash: c.cfg.OnCrash, Prefix: c.prefix}
	if c.webhooks != nil {
		ex.Events = c.webhooks.Settings.Events
	}
	return ex
}

// notForwarded are request headers that concern the gateway, not the upstream. Accept-Encoding
// goes too, so stored results are plain and their JSON can be shown inline.
var notForwarded = []string{"Prefer", "Callback-Url", headerMaxQueueWait, "Accept-Encoding", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade"}

// storedRequest is the request as the runner will send it again: the URI as the client sent
// it, so the route matches it the same way.
func storedRequest(kr *keyedRequest) *store.Request {
	r := kr.r
	uri := r.RequestURI
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && orig.RequestURI != "" {
		uri = orig.RequestURI
	}
	h := r.Header.Clone()
	for _, name := range notForwarded {
		h.Del(name)
	}
	return &store.Request{Method: r.Method, URL: uri, Host: r.Host, Proto: r.Proto, RemoteAddr: r.RemoteAddr, Header: h, Body: kr.body}
}

// accepted is the 202 answer for op, as sent and as recorded for the key.
func (c *converter) accepted(op *store.Operation, expires time.Time) store.Response {
	l := opview.LinksFor(c.prefix, op.ID)
	body, _ := json.Marshal(opview.Accepted{
		OperationID: op.ID, Status: op.Status, StatusURL: l.Self, SubmittedAt: op.SubmittedAt.UTC(),
		IdempotencyKey: op.IdempotencyKey, WebhookRegistered: op.Callback != nil, Links: l,
	})
	h := http.Header{}
	h.Set("Location", l.Self)
	h.Set("Retry-After", apierr.RetryAfterValue(opview.PollAfter))
	h.Set("Preference-Applied", "respond-async")
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Vary", "Prefer")
	if !expires.IsZero() {
		h.Set(headerExpires, expires.UTC().Format(http.TimeFormat))
	}
	return store.Response{Status: http.StatusAccepted, Header: h, Body: append(body, '\n')}
}

// keyAccept ties op's acceptance to the request's key, if it has one; answer is the answer
// sent and recorded for it.
func (c *converter) keyAccept(kr *keyedRequest, op *store.Operation, token string, answer func(*store.Operation, time.Time) store.Response) (*store.KeyAccept, store.Response) {
	if kr.key == "" {
		return nil, answer(op, time.Time{})
	}
	expires := c.gate.expiry()
	resp := answer(op, expires)
	return &store.KeyAccept{Key: kr.recordKey, Fingerprint: kr.fp, Token: token, Response: resp, Expires: expires}, resp
}

// accept stores the request as a queued operation (durably, with its key) and answers 202.
func (c *converter) accept(w http.ResponseWriter, kr *keyedRequest, st store.Backend, run *runner.Runner) error {
	resp, ok, err := c.enqueue(w, kr, st, run, c.newOperation(kr, store.StatusQueued), storedRequest(kr), c.accepted)
	if ok {
		capture.WriteResponse(w, resp)
	}
	return err
}

// enqueue stores op, queued, with the request req it will send (durably, with the request's
// key, whose record is answer's), and returns the answer to send; ok is false when it has
// answered the client itself (the queue or the scope is full, the key has a record, the
// storage failed).
func (c *converter) enqueue(w http.ResponseWriter, kr *keyedRequest, st store.Backend, run *runner.Runner, op *store.Operation, req *store.Request,
	answer func(*store.Operation, time.Time) store.Response) (resp store.Response, ok bool, err error) {
	if priorityRefused(w, c.capacity, kr.r.Header.Get("Content-Type"), kr.body) {
		return resp, false, nil
	}
	if n := run.Queued(); n >= int64(c.cfg.Queue) && !c.recorded(kr, st) {
		countRequest(outcomeQueueFull)
		apierr.Write(w, apierr.Error{Code: apierr.CodeQueueFull, RetryAfter: 5 * time.Second, Details: map[string]any{"queue": c.cfg.Queue},
			Message: "The operation queue is full; retry later."})
		return resp, false, nil
	}
	if c.quota != nil {
		if op.ScopeLimit = c.quota.room(kr.scope); op.ScopeLimit <= 0 && !c.recorded(kr, st) {
			c.rateLimited(w)
			return resp, false, nil
		}
	}
	span := tracing.StartAccept(kr.r.Context(), kr.trace)
	ka, resp := c.keyAccept(kr, op, "", answer)
	claim, err := st.AcceptOperation(op, req, ka)
	if err != nil || claim.Outcome != store.Claimed {
		tracing.EndAccept(span, nil)
	}
	if errors.Is(err, store.ErrScopeFull) {
		c.rateLimited(w)
		return resp, false, nil
	}
	if err != nil {
		return resp, false, c.gate.storageFailed(w, kr, err)
	}
	if claim.Outcome != store.Claimed {
		if claim.Outcome == store.Replay && kr.replayed != nil && kr.replayed(claim) {
			return resp, false, nil
		}
		if !c.gate.joinStream(w, kr, st, claim) {
			c.gate.answer(w, kr, claim)
		}
		return resp, false, nil
	}
	defer tracing.EndAccept(span, op)
	countRequest(outcomeAccepted)
	countSubmitted(op)
	run.Accepted()
	kr.log.Info("operation accepted", zap.String("operation_id", op.ID), zap.String("type", op.Type), zap.String("new_status", string(op.Status)))
	return resp, true, nil
}

// runThenConvert runs the request and answers it directly if the upstream finishes within
// window; otherwise it stores the running call as an operation, answers 202, and lets the
// runner see the call through. One deadline, now plus the async timeout, bounds the key's claim
// and the call, so the claim cannot lapse while the call it guards still runs. The calls under
// way here are bounded by the block's concurrency: without a free slot the request is queued
// for the worker pool at once.
func (c *converter) runThenConvert(w http.ResponseWriter, kr *keyedRequest, next caddyhttp.Handler, st store.Backend, run *runner.Runner, window time.Duration) error {
	if !c.calls.tryAcquire() {
		return c.accept(w, kr, st, run)
	}
	leave, ok := c.admit(w, kr, st) // the call counts for its scope while it may become an operation
	if !ok {
		c.calls.release()
		return nil
	}
	defer leave()
	deadline := c.clock.Now().Add(time.Duration(c.cfg.Timeout))
	token := ""
	if kr.key != "" {
		claim, err := st.ClaimKey(kr.recordKey, kr.fp, c.clock.Until(deadline))
		if err != nil {
			c.calls.release()
			return c.gate.storageFailed(w, kr, err)
		}
		if claim.Outcome != store.Claimed {
			c.calls.release()
			if !c.gate.joinStream(w, kr, st, claim) {
				c.gate.answer(w, kr, claim)
			}
			return nil
		}
		token = claim.Token
	}
	base, cancel := context.WithCancelCause(ownVars(context.WithoutCancel(kr.r.Context())))
	ctx, stop := withDeadline(base, c.clock, deadline)
	// The slot is free again when the call's context ends: when it is answered here, or when
	// the runner settles the converted operation (it cancels the context then), or at the deadline.
	context.AfterFunc(ctx, func() { stop(); c.calls.release() })
	// The call owns the seat reserved for it (Handler.reserveSeat) from here: the handler drops
	// a seat nobody took when it returns, which, once the call is converted, may be before the
	// attempt took it. The seat moves to a ticket of the call's own, dropped if the attempt
	// ends without taking it.
	ctx, own := capacity.WithTicket(ctx, capacity.TicketOf(ctx).Take())
	first := make(chan attemptResult, 1)
	stream := newOpStream()
	go func() {
		defer own.Drop()
		if hook := testHookAttemptStarting.Load(); hook != nil {
			(*hook)()
		}
		first <- c.attemptNext(ctx, kr, next, stream)
	}()

	t := c.clock.NewTimer(window)
	defer t.Stop()
	select {
	case res := <-first:
		defer cancel(nil)
		countRequest(outcomeNew)
		c.answerInWindow(w, kr, st, token, res, ctx.Err())
		return nil
	case <-stream.Begun():
		return c.relayLive(w, kr, st, token, stream, first, cancel)
	case <-t.Chan():
	case <-kr.r.Context().Done(): // the client left: convert, so the call's outcome is kept
	}
	op := c.newOperation(kr, store.StatusRunning)
	op.Holder, op.LeaseUntil = run.Worker(), op.StartedAt.Add(run.Settings().Takeover) // held by this runner, as a claimed one
	span := tracing.StartAccept(kr.r.Context(), kr.trace)
	ka, resp := c.keyAccept(kr, op, token, c.accepted)
	if _, err := st.AcceptOperation(op, storedRequest(kr), ka); err != nil {
		tracing.EndAccept(span, nil)
		cancel(err)
		return c.gate.storageFailed(w, kr, err)
	}
	defer tracing.EndAccept(span, op)
	countRequest(outcomeAccepted)
	countSubmitted(op)
	run.LaunchConverted(op, ctx, cancel, first)
	kr.log.Info("call converted to an operation", zap.String("operation_id", op.ID), zap.String("type", op.Type), zap.String("new_status", string(op.Status)))
	capture.WriteResponse(w, resp)
	return nil
}

// admit applies async max_per_scope to a call that runs within its window and may then become
// an operation. It answers 429 RATE_LIMITED itself and reports false when the caller's scope is
// full; a keyed retry of a request already accepted goes on to its replay. The caller calls
// leave once the operation is stored or given up.
func (c *converter) admit(w http.ResponseWriter, kr *keyedRequest, st store.Backend) (leave func(), ok bool) {
	if c.quota == nil {
		return func() {}, true
	}
	leave, ok, err := c.quota.enter(st, kr.scope)
	switch {
	case err != nil:
		_ = c.gate.storageFailed(w, kr, err)
		return nil, false
	case ok:
		return leave, true
	}
	if c.recorded(kr, st) {
		return func() {}, true
	}
	c.rateLimited(w)
	return nil, false
}

// rateLimited answers 429 RATE_LIMITED: the caller's scope is at max_per_scope.
func (c *converter) rateLimited(w http.ResponseWriter) {
	countRequest(outcomeRateLimited)
	apierr.Write(w, rateLimitedError(c.cfg.MaxPerScope))
}

// recorded reports whether the request's key already has a live record: its retry is answered
// from that record (a replay of the 202, a mismatch, or in progress) and adds nothing to the
// queue, so neither a full queue nor max_per_scope may refuse it.
func (c *converter) recorded(kr *keyedRequest, st store.Keys) bool {
	if kr.key == "" {
		return false
	}
	rec, err := st.LookupKey(kr.recordKey)
	return err == nil && rec != nil
}

// answerInWindow answers a call that ended within its window: the upstream's answer, recorded
// for the key when the policy keeps it, or, when there is no whole answer, the outcome table's
// error (docs/api.md). An answer over max_result fails as RESULT_TOO_LARGE rather than passing
// through: the call was buffered to max_result and no further, so there is nothing whole to pass.
func (c *converter) answerInWindow(w http.ResponseWriter, kr *keyedRequest, st store.Keys, token string, res attemptResult, ctxErr error) {
	if kr.key != "" {
		if expires, ok := c.gate.recordOutcome(st, kr, token, res); ok {
			w.Header().Set(headerExpires, expires.UTC().Format(http.TimeFormat))
		}
	}
	switch {
	case res.Panicked != nil: // a buggy handler of the route: the outcome table's UPSTREAM_ERROR
		kr.log.Error("a handler panicked serving the call", zap.Any("panic", res.Panicked), zap.ByteString("stack", res.Stack))
		apierr.Write(w, apierr.Error{Code: apierr.CodeUpstreamError, RetryAfter: time.Second, Message: "A handler of the route failed while serving the call."})
	case res.Over:
		apierr.Write(w, apierr.Error{Code: apierr.CodeResultTooLarge, Details: map[string]any{"max_result": c.cfg.MaxResult},
			Message: fmt.Sprintf("The upstream response is over the %d-byte max_result.", c.cfg.MaxResult)})
	case res.Status == 0 && errors.Is(ctxErr, context.DeadlineExceeded):
		apierr.Write(w, apierr.Error{Code: apierr.CodeOperationTimeout, RetryAfter: time.Second, Message: "The upstream call did not finish within the async timeout."})
	case res.Status == 0:
		apierr.Write(w, apierr.Error{Code: apierr.CodeUpstreamUnavailable, RetryAfter: time.Second, Message: errUpstreamUnreachable.Error() + "."})
	default:
		capture.WriteResponse(w, store.Response{Status: res.Status, Header: res.Header, Body: res.Body})
	}
}

// ownVars gives a call that may outlive its request its own copy of Caddy's vars map: Caddy
// still reads the request's map (access logs) after the handler returns.
func ownVars(ctx context.Context) context.Context {
	vars, ok := ctx.Value(caddyhttp.VarsCtxKey).(map[string]any)
	if !ok {
		return ctx
	}
	return context.WithValue(ctx, caddyhttp.VarsCtxKey, maps.Clone(vars))
}

// testHookAttemptStarting, when set by a test, runs as a call's first attempt starts, before
// it takes its seat. Atomic: calls of gateways an earlier test left read it.
var testHookAttemptStarting atomic.Pointer[func()]

// attemptNext sends the request to the rest of the route, recording the answer in memory.
// An event-stream answer is also published on stream as it arrives.
func (c *converter) attemptNext(ctx context.Context, kr *keyedRequest, next caddyhttp.Handler, stream *opStream) attemptResult {
	up := kr.r.WithContext(ctx) // ctx carries the call's deadline
	setBody(up, kr.body)
	rec := capture.NewBuffer(c.cfg.MaxResult)
	rec.Stream = stream
	res := runner.ServeRecorded(rec, func() error { return next.ServeHTTP(rec, up) })
	if res.Status != 0 && !res.Over {
		stream.Finish(streams.Whole)
	} else {
		stream.Finish(streams.BrokeOff)
	}
	return res
}

// relayLive answers a call in after mode whose answer began streaming within the window: it is
// relayed live, never held until the window ends (docs/streams.md). The call outlives the
// client as any keyed call does; its key records the answer as relayed, ids included.
func (c *converter) relayLive(w http.ResponseWriter, kr *keyedRequest, st store.Keys, token string, s *opStream, first <-chan attemptResult, cancel context.CancelCauseFunc) error {
	defer cancel(nil)
	countRequest(outcomeNew)
	status, header := s.Head()
	capture.SetRecordedHeader(w.Header(), header)
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	broken := streams.Relay(w, kr.r, s, 0)
	res := <-first
	if kr.key != "" {
		if res.Status != 0 && !res.Over {
			res.Body = s.Relayed()
		}
		c.gate.recordOutcome(st, kr, token, res)
	}
	if broken {
		panic(http.ErrAbortHandler) // see streams.Relay
	}
	return nil
}

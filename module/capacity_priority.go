package module

import (
	"mime"
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/store"
)

// Passing urgency upstream (docs/capacity.md): with pass_priority, the top-level "priority"
// field of a JSON body sent upstream is set to the trusted urgency (storedUrgency) in the
// model server's scale. Only the request that goes upstream changes: the fingerprint and the
// stored request keep the client's body.

// isJSON reports whether a Content-Type declares JSON.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || len(mt) > 5 && mt[len(mt)-5:] == "+json")
}

// passPriorityLive rewrites a live call's body for the upstream, read as the gate reads bodies
// (max_body, within max_buffered); release gives its bytes back once the call is over. false:
// it answered (400 for a body declared JSON that is not a JSON object, 413, 503 GATEWAY_BUSY).
func (h *Handler) passPriorityLive(w http.ResponseWriter, r *http.Request, a seatAsk) (_ *http.Request, release func(), ok bool) {
	mode := h.Capacity.PassPriority
	if mode == "" || r.Body == nil || r.Body == http.NoBody || !isJSON(r.Header.Get("Content-Type")) {
		return r, func() {}, true
	}
	w.Header().Set(headerRequestID, r.Header.Get(headerRequestID))
	body, reserved, err := h.gate.readBody(w, r, h.bodies, newReqLog(h.logger, zap.String("request_id", r.Header.Get(headerRequestID))))
	_ = r.Body.Close()
	if err != nil {
		return nil, nil, false
	}
	release = func() { h.bodies.give(reserved) }
	if body, err = capacity.SetBodyPriority(body, capacity.UpstreamPriority(mode, storedUrgency(a))); err != nil {
		release()
		apierr.Write(w, apierr.Error{Code: apierr.CodeInvalidRequest,
			Message: "The request body is declared JSON but is not a JSON object."})
		return nil, nil, false
	}
	r2 := r.Clone(r.Context())
	setBody(r2, body)
	if r2.Header.Get("Content-Length") != "" {
		r2.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	return r2, release, true
}

// passPriorityStored returns the request an operation's attempt sends upstream: a copy of req
// with its body's priority set at the operation's stored (trusted) urgency. A body that is not
// a JSON object goes as it is.
func (p *seatPool) passPriorityStored(op *store.Operation, req *store.Request) *store.Request {
	p.mu.Lock()
	mode := p.cfg.PassPriority
	p.mu.Unlock()
	if mode == "" || req == nil || !isJSON(req.Header.Get("Content-Type")) {
		return req
	}
	body, err := capacity.SetBodyPriority(req.Body, capacity.UpstreamPriority(mode, store.ClampUrgency(op.Urgency)))
	if err != nil {
		return req
	}
	out := *req
	out.Header = req.Header.Clone()
	out.Header.Set("Content-Length", strconv.Itoa(len(body)))
	out.Body = body
	return &out
}

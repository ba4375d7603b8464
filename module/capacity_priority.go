package module

import (
	"io"
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/store"
)

// Passing urgency upstream (docs/capacity.md): with pass_priority, the top-level "priority"
// field of a JSON body sent upstream is set to the trusted urgency (capacity.Ask.Stored) in the
// model server's scale. Only the request that goes upstream changes: the fingerprint and the
// stored request keep the client's body.

// priorityRefused answers 400 a body declared JSON that pass_priority cannot set a priority in
// (not a JSON object); false when it answered. The check comes before a call waits for a seat
// or becomes an operation, so that live calls and operations refuse the same bodies.
func priorityRefused(w http.ResponseWriter, cfg *CapacityConfig, contentType string, body []byte) bool {
	if cfg == nil || !capacity.RefusesBody(cfg.PassPriority, contentType, body) {
		return false
	}
	countRequest(outcomeRejected)
	apierr.Write(w, apierr.Error{Code: apierr.CodeInvalidRequest,
		Message: "The request body is declared JSON but is not a JSON object."})
	return true
}

// passPriorityLive rewrites a live call's body for the upstream. A body the gate holds already
// (a keyed call's) is read from memory; any other is read as the gate reads bodies (max_body,
// within max_buffered), and release gives its bytes back once the call is over. false: it
// answered (400 for a body declared JSON that is not a JSON object, 413, 503 GATEWAY_BUSY).
func (h *Handler) passPriorityLive(w http.ResponseWriter, r *http.Request, a seatAsk) (_ *http.Request, release func(), ok bool) {
	mode := h.Capacity.PassPriority
	if mode == "" || r.Body == nil || r.Body == http.NoBody || !capacity.IsJSON(r.Header.Get("Content-Type"), r.ContentLength) {
		return r, func() {}, true
	}
	w.Header().Set(headerRequestID, r.Header.Get(headerRequestID))
	var body []byte
	var err error
	release = func() {}
	if r.GetBody != nil { // the gate's copy (setBody): a server's own request has none
		rc, gerr := r.GetBody()
		if gerr == nil {
			body, err = io.ReadAll(rc)
		} else {
			err = gerr
		}
	} else {
		var reserved int64
		body, reserved, err = h.gate.readBody(w, r, h.bodies, newReqLog(h.logger, zap.String("request_id", r.Header.Get(headerRequestID))))
		_ = r.Body.Close()
		if err != nil {
			return nil, nil, false
		}
		release = func() { h.bodies.give(reserved) }
	}
	if err == nil {
		body, err = capacity.SetBodyPriority(body, capacity.UpstreamPriority(mode, a.Stored()))
	}
	if err != nil {
		release()
		countRequest(outcomeRejected)
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
	mode, _ := p.passPriority.Load().(string)
	return capacity.WithStoredPriority(mode, store.ClampUrgency(op.Urgency), req)
}

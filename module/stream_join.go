package module

import (
	"net/http"

	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
)

// headerLastEventID is the SSE reconnection header: the id of the last event the client has.
const headerLastEventID = "Last-Event-ID"

// joinStream answers a duplicate of a keyed request whose answer is an event stream: a
// finished stream replays whole, a live one is joined (the events so far, then live, to the
// same end), and Last-Event-ID resumes after that event (docs/streams.md). It reports false
// when the key has no stream to join; the caller then answers as
// for any other request.
func (g *gate) joinStream(w http.ResponseWriter, kr *keyedRequest, st store.Backend, claim store.Claim) bool {
	if claim.Outcome != store.Replay && claim.Outcome != store.InProgress {
		return false
	}
	js, ok := g.keyed.Join(st, kr.recordKey, claim, g.clock)
	if !ok {
		return false
	}
	countRequest(outcomeReplayed)
	after := uint64(0)
	if id := kr.r.Header.Get(headerLastEventID); id != "" {
		after, _ = js.Source.Find(id) // an unknown id resumes from the start
	}
	h := w.Header()
	capture.SetRecordedHeader(h, js.Header)
	h.Set(headerReplayed, "true")
	if !js.Expires.IsZero() {
		h.Set(headerExpires, js.Expires.UTC().Format(http.TimeFormat))
	}
	w.WriteHeader(js.Status)
	if streams.Relay(w, kr.r, js.Source, after) {
		panic(http.ErrAbortHandler) // as the first client's connection was: see streams.Relay
	}
	return true
}

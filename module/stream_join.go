package module

import (
	"net/http"
	"time"

	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
)

// headerLastEventID is the SSE reconnection header: the id of the last event the client has.
const headerLastEventID = "Last-Event-ID"

// joinedStream is what a duplicate of a keyed stream follows, and how to answer it.
type joinedStream struct {
	src     streams.Source
	status  int
	header  http.Header
	expires time.Time // zero while the stream is live
}

// joinStream answers a duplicate of a keyed request whose answer is an event stream: a
// finished stream replays whole, a live one is joined (the events so far, then live, to the
// same end), and Last-Event-ID resumes after that event (docs/streams.md). It reports false
// when the key has no stream to join; the caller then answers as
// for any other request.
func (g *gate) joinStream(w http.ResponseWriter, kr *keyedRequest, st store.Backend, claim store.Claim) bool {
	if claim.Outcome != store.Replay && claim.Outcome != store.InProgress {
		return false
	}
	js, ok := g.streamToJoin(kr, st, claim)
	if !ok {
		return false
	}
	countRequest(outcomeReplayed)
	after := uint64(0)
	if id := kr.r.Header.Get(headerLastEventID); id != "" {
		after, _ = js.src.Find(id) // an unknown id resumes from the start
	}
	h := w.Header()
	capture.SetRecordedHeader(h, js.header)
	h.Set(headerReplayed, "true")
	if !js.expires.IsZero() {
		h.Set(headerExpires, js.expires.UTC().Format(http.TimeFormat))
	}
	w.WriteHeader(js.status)
	if streams.Relay(w, kr.r, js.src, after) {
		panic(http.ErrAbortHandler) // as the first client's connection was: see streams.Relay
	}
	return true
}

// streamToJoin finds the stream of the key's current attempt: finished (a replay), live in
// this process (the broadcast), or live elsewhere (the store).
func (g *gate) streamToJoin(kr *keyedRequest, st store.StreamRecorder, claim store.Claim) (joinedStream, bool) {
	switch claim.Outcome {
	case store.Replay:
		rec := claim.Record
		if !rec.Streamed {
			return joinedStream{}, false
		}
		page, err := st.ReadEvents(kr.recordKey, 0, 0)
		if err != nil || page.State != store.StreamFinished {
			return joinedStream{}, false
		}
		src := streams.NewStored(st, kr.recordKey, page.Token, g.clock)
		return joinedStream{src: src, status: rec.Response.Status, header: rec.Response.Header, expires: rec.ExpiresAt}, true
	case store.InProgress:
		if l := g.streams.get(kr.recordKey); l != nil && l.Holder().Token == claim.Record.Token {
			status, header := l.Head()
			return joinedStream{src: l, status: status, header: header}, l.Joinable()
		}
		page, err := st.ReadEvents(kr.recordKey, 0, 0)
		if err != nil || page.Token != claim.Record.Token || (page.State != store.StreamLive && page.State != store.StreamFinished) {
			return joinedStream{}, false
		}
		return joinedStream{src: streams.NewStored(st, kr.recordKey, page.Token, g.clock), status: page.Status, header: page.Header}, true
	}
	return joinedStream{}, false
}

package module

import (
	"net/http"
	"time"

	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/store"
)

// headerLastEventID is the SSE reconnection header: the id of the last event the client has.
const headerLastEventID = "Last-Event-ID"

// eventSource is where a joiner reads a stream: a live stream of this process, or the store
// (a finished stream, or one another gateway relays).
type eventSource interface {
	// next returns events after cursor; with none, either how the stream ended or a channel
	// that is ready when it is worth asking again.
	next(cursor uint64) ([]store.StreamEvent, streamEnd, <-chan struct{}, error)
	// find returns the position of the event with the given id.
	find(id string) (uint64, bool)
}

// storedStream follows a stream through the store alone, by short polling.
type storedStream struct {
	st     store.StreamRecorder
	stream []byte        // the stream's id
	token  string        // the attempt followed: another attempt's stream is not this one
	wait   time.Duration // before the next poll: pollInterval after events, doubling while quiet
}

// maxPollInterval caps the backoff of a follower polling a quiet stream: a stalled stream with
// many followers on other replicas costs each of them two reads a second, not twenty.
const maxPollInterval = 500 * time.Millisecond

func (s *storedStream) next(cursor uint64) ([]store.StreamEvent, streamEnd, <-chan struct{}, error) {
	page, err := s.st.ReadEvents(s.stream, cursor, readPage)
	switch {
	case err != nil:
		return nil, streamOpen, nil, err
	case page.Token != s.token:
		return nil, streamBrokeOff, nil, nil
	case len(page.List) > 0:
		s.wait = 0
		return page.List, streamOpen, nil, nil
	case page.State == store.StreamFinished && cursor >= page.Events:
		return nil, streamWhole, nil, nil
	case page.State == store.StreamLive:
		s.wait = min(max(2*s.wait, pollInterval), maxPollInterval)
		return nil, streamOpen, pollTick(s.wait), nil
	}
	return nil, streamBrokeOff, nil, nil
}

// pollTick is ready after d.
func pollTick(d time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	time.AfterFunc(d, func() { close(ch) })
	return ch
}

func (s *storedStream) find(id string) (uint64, bool) {
	seq, ok, err := s.st.FindEvent(s.stream, id)
	return seq, ok && err == nil
}

// joinedStream is what a duplicate of a keyed stream follows, and how to answer it.
type joinedStream struct {
	src     eventSource
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
		after, _ = js.src.find(id) // an unknown id resumes from the start
	}
	h := w.Header()
	capture.SetRecordedHeader(h, js.header)
	h.Set(headerReplayed, "true")
	if !js.expires.IsZero() {
		h.Set(headerExpires, js.expires.UTC().Format(http.TimeFormat))
	}
	w.WriteHeader(js.status)
	if relayEvents(w, kr.r, js.src, after) {
		panic(http.ErrAbortHandler) // as the first client's connection was: see relayEvents
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
		src := &storedStream{st: st, stream: kr.recordKey, token: page.Token}
		return joinedStream{src: src, status: rec.Response.Status, header: rec.Response.Header, expires: rec.ExpiresAt}, true
	case store.InProgress:
		if l := g.streams.get(kr.recordKey); l != nil && l.holder.Token == claim.Record.Token {
			return joinedStream{src: l, status: l.status, header: l.header}, l.joinable()
		}
		page, err := st.ReadEvents(kr.recordKey, 0, 0)
		if err != nil || page.Token != claim.Record.Token || (page.State != store.StreamLive && page.State != store.StreamFinished) {
			return joinedStream{}, false
		}
		return joinedStream{src: &storedStream{st: st, stream: kr.recordKey, token: page.Token}, status: page.Status, header: page.Header}, true
	}
	return joinedStream{}, false
}

// relayEvents writes the stream's events after `after` as they come, each flushed, and reports
// whether the stream broke off. The caller then aborts the connection (panic with
// http.ErrAbortHandler, as the proxy does for the first client), so no client takes part of an
// answer for the whole. A follower that leaves only stops its own copy.
func relayEvents(w http.ResponseWriter, r *http.Request, src eventSource, after uint64) (broken bool) {
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for cursor := after; ; {
		evs, end, wait, err := src.next(cursor)
		switch {
		case err != nil || end == streamBrokeOff:
			return true
		case end == streamWhole:
			return false
		}
		for _, e := range evs {
			if e.Seq <= cursor {
				continue
			}
			if _, err := w.Write(e.Data); err != nil {
				return false
			}
			cursor = e.Seq
		}
		if len(evs) > 0 {
			if rc.Flush() != nil {
				return false
			}
			continue
		}
		select {
		case <-wait:
		case <-r.Context().Done():
			return false
		}
	}
}

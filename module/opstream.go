package module

import (
	"mime"
	"net/http"
	"strings"
	"sync"

	"github.com/mulligan-gw/mulligan/store"
)

// opStream is the event stream of an operation's answer, cut into events with ids the same
// way a keyed stream is relayed, for GET {operations}/{id}/result with Accept: text/event-stream
// (docs/streams.md): live while the runner's attempt receives it, or rebuilt from the stored
// result once the operation is final.
type opStream struct {
	mu      sync.Mutex
	changed chan struct{}
	status  int
	header  http.Header
	split   sseSplitter
	events  []store.StreamEvent
	bytes   int64
	end     streamEnd
	begun   chan struct{} // closed when an event-stream answer begins
}

func newOpStream() *opStream {
	return &opStream{changed: make(chan struct{}), begun: make(chan struct{})}
}

// begin sets the answer's status and headers; it reports whether the answer is an event stream.
func (s *opStream) begin(status int, header http.Header) bool {
	if !isEventStream(header.Get("Content-Type")) {
		return false
	}
	s.mu.Lock()
	s.status, s.header = status, header
	s.notify()
	s.mu.Unlock()
	close(s.begun)
	return true
}

// head returns the answer's status and headers.
func (s *opStream) head() (int, http.Header) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status, s.header
}

// relayed is the whole answer as its events were relayed, ids included, and any unterminated
// rest: what a replay must give.
func (s *opStream) relayed() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]byte, 0, s.bytes+int64(s.split.buffered()))
	for _, e := range s.events {
		out = append(out, e.Data...)
	}
	return append(out, s.split.buf...)
}

func (s *opStream) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// write adds upstream bytes: each event they complete is numbered and published.
func (s *opStream) write(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.split.push(p, func(block []byte) {
		data, id := withEventID(block, uint64(len(s.events)+1))
		s.events = append(s.events, store.StreamEvent{Seq: uint64(len(s.events) + 1), ID: id, Data: data})
		s.bytes += int64(len(data))
	})
	s.notify()
}

// finish ends the stream: whole when the upstream ended it, else broken off.
func (s *opStream) finish(end streamEnd) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.end == streamOpen {
		s.end = end
		s.notify()
	}
}

// started reports whether the answer has begun and is an event stream.
func (s *opStream) started() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status != 0
}

// progress is what the operation resource shows while the operation runs.
func (s *opStream) progress() *progressView {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &progressView{Events: len(s.events), Bytes: s.bytes}
}

func (s *opStream) next(cursor uint64) ([]store.StreamEvent, streamEnd, <-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case cursor < uint64(len(s.events)):
		evs := s.events[cursor:]
		return evs[:min(len(evs), readPage)], streamOpen, nil, nil
	case s.end != streamOpen:
		return nil, s.end, nil, nil
	}
	return nil, streamOpen, s.changed, nil
}

func (s *opStream) find(id string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.events {
		if e.ID == id {
			return e.Seq, true
		}
	}
	return 0, false
}

// opStreams are the streams of the operations this runner is executing, by operation id.
type opStreams struct {
	mu sync.Mutex
	m  map[string]*opStream
}

// start registers a fresh stream for an attempt of operation id.
func (o *opStreams) start(id string) *opStream {
	s := newOpStream()
	o.mu.Lock()
	if o.m == nil {
		o.m = map[string]*opStream{}
	}
	o.m[id] = s
	o.mu.Unlock()
	return s
}

// end ends an attempt's stream and forgets it.
func (o *opStreams) end(id string, s *opStream, whole bool) {
	o.mu.Lock()
	if o.m[id] == s {
		delete(o.m, id)
	}
	o.mu.Unlock()
	if whole {
		s.finish(streamWhole)
	} else {
		s.finish(streamBrokeOff)
	}
}

// get returns the live event stream of operation id, or nil.
func (o *opStreams) get(id string) *opStream {
	o.mu.Lock()
	s := o.m[id]
	o.mu.Unlock()
	if s == nil || !s.started() {
		return nil
	}
	return s
}

// streamOf returns the live event stream of operation id on this runner, or nil.
func (r *runner) streamOf(id string) *opStream {
	if r == nil {
		return nil
	}
	return r.streams.get(id)
}

// progressView is a running operation's progress: the events and bytes of its streamed answer
// so far.
type progressView struct {
	Events int   `json:"events"`
	Bytes  int64 `json:"bytes"`
}

// wantsEventStream reports whether the client asked for Server-Sent Events.
func wantsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == "text/event-stream" {
				return true
			}
		}
	}
	return false
}

// followResult serves an operation's answer as Server-Sent Events: the events so far, then the
// live ones while it runs; Last-Event-ID or ?starting_after= resumes after that event. It
// reports false when there is no event stream to serve (the caller answers as usual).
func (h *Handler) followResult(q *opsRequest, op *store.Operation) bool {
	var s *opStream
	if !op.Status.Final() {
		if s = q.run.streamOf(op.ID); s == nil {
			return false
		}
	} else {
		res, err := q.st.LoadResult(op.ID)
		if err != nil || res == nil {
			return false
		}
		if s = newOpStream(); !s.begin(res.Status, res.Header) {
			return false
		}
		s.write(res.Body)
		s.finish(streamWhole)
	}
	after := uint64(0)
	id := q.r.Header.Get(headerLastEventID)
	if id == "" {
		id = q.r.URL.Query().Get("starting_after")
	}
	if id != "" {
		after, _ = s.find(id)
	}
	status, header := s.head()
	for k, v := range header {
		q.w.Header()[k] = v
	}
	q.w.Header().Del("Content-Length")
	q.w.WriteHeader(status)
	if relayEvents(q.w, q.r, s, after) {
		panic(http.ErrAbortHandler) // see relayEvents
	}
	return true
}

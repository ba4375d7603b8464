package module

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/sse"
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
	split   sse.Splitter
	events  []store.StreamEvent
	bytes   int64
	end     streamEnd
	begun   chan struct{} // closed when an event-stream answer begins
	// rec, when set, copies the stream into a store shared by replicas, for followers on the
	// others (opRecording).
	rec *opRecording
}

func newOpStream() *opStream {
	return &opStream{changed: make(chan struct{}), begun: make(chan struct{})}
}

// Open sets the answer's status and headers; it reports whether the answer is an event stream.
func (s *opStream) Open(status int, header http.Header) bool {
	if !sse.IsEventStream(header.Get("Content-Type")) {
		return false
	}
	s.mu.Lock()
	s.status, s.header = status, header
	s.notify()
	s.mu.Unlock()
	s.rec.begin(status, header)
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
	out := make([]byte, 0, s.bytes+int64(s.split.Buffered()))
	for _, e := range s.events {
		out = append(out, e.Data...)
	}
	return append(out, s.split.Partial()...)
}

func (s *opStream) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Write adds upstream bytes: each event they complete is numbered and published.
func (s *opStream) Write(p []byte) {
	s.mu.Lock()
	from := len(s.events)
	s.split.Push(p, func(block []byte) {
		data, id := sse.WithEventID(block, uint64(len(s.events)+1))
		s.events = append(s.events, store.StreamEvent{Seq: uint64(len(s.events) + 1), ID: id, Data: data})
		s.bytes += int64(len(data))
	})
	added := s.events[from:len(s.events):len(s.events)]
	s.notify()
	s.mu.Unlock()
	s.rec.add(added) // outside mu: it may wait for the store, and followers here need not
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
	// changed is closed when an attempt starts or ends, for followers waiting for an answer to
	// begin (await); nil until one waits.
	changed chan struct{}
}

// start registers a fresh stream for an attempt of operation id, copied to the store by rec
// when it is set.
func (o *opStreams) start(id string, rec *opRecording) *opStream {
	s := newOpStream()
	s.rec = rec
	o.mu.Lock()
	if o.m == nil {
		o.m = map[string]*opStream{}
	}
	o.m[id] = s
	o.signal()
	o.mu.Unlock()
	return s
}

// end ends an attempt's stream and forgets it.
func (o *opStreams) end(id string, s *opStream, whole bool) {
	o.mu.Lock()
	if o.m[id] == s {
		delete(o.m, id)
	}
	o.signal()
	o.mu.Unlock()
	s.rec.end(whole)
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

// followResult serves an operation's answer as Server-Sent Events: the events so far, then the
// live ones while it runs (from this replica's runner, or from the store when another replica
// runs it); Last-Event-ID or ?starting_after= resumes after that event. It reports false when
// there is no event stream to serve (the caller answers as usual).
func (h *Handler) followResult(q *opsRequest, op *store.Operation) bool {
	var (
		src    eventSource
		status int
		header http.Header
	)
	switch {
	case !op.Status.Final():
		if s := q.run.streamOf(op.ID); s != nil {
			src = s
			status, header = s.head()
		} else if f, page := q.run.followStored(op); f != nil {
			src, status, header = f, page.Status, page.Header
		} else {
			return false
		}
	default:
		res, err := q.st.LoadResult(op.ID)
		if err != nil || res == nil {
			return false
		}
		s := newOpStream()
		if !s.Open(res.Status, res.Header) {
			return false
		}
		s.Write(res.Body)
		s.finish(streamWhole)
		src = s
		status, header = s.head()
	}
	after := uint64(0)
	id := q.r.Header.Get(headerLastEventID)
	if id == "" {
		id = q.r.URL.Query().Get("starting_after")
	}
	if id != "" {
		after, _ = src.find(id)
	}
	capture.SetRecordedHeader(q.w.Header(), header)
	q.w.Header().Del("Content-Length")
	q.w.WriteHeader(status)
	if relayEvents(q.w, q.r, src, after) {
		panic(http.ErrAbortHandler) // see relayEvents
	}
	return true
}

// opRecording copies an operation's streamed answer into a store shared by replicas, so that a
// follower on another replica than the one running the operation reads the stream there. It is
// a keyed stream's appender (liveStream, group-committed beside the relay) on a stream named by
// the operation's own id and held by this attempt (store.OperationHolder): the store checks in
// each write that the operation still runs under this worker, so an attempt whose operation was
// taken over can neither replace nor write into the running attempt's stream, and followers
// read a stream whose holder lost the operation as aborted. A nil *opRecording records nothing.
type opRecording struct {
	clock  clockwork.Clock
	st     store.StreamRecorder
	id     string
	holder store.StreamHolder
	keep   time.Duration // how long the store keeps the events: the attempt's whole run, and a minute
	log    reqLog
	live   *liveStream
}

// recordingFor returns what copies the stream of an attempt of operation id to a shared store,
// or nil when the storage is this process's alone (its followers are all here). Every backend
// records streams; only storage that replicas share, PostgreSQL, has followers elsewhere.
func (r *runner) recordingFor(ctx context.Context, id string) *opRecording {
	if r.shared == nil {
		return nil
	}
	keep := time.Hour
	if dl, ok := ctx.Deadline(); ok {
		keep = r.clock.Until(dl) + 30*time.Second
	}
	return &opRecording{clock: r.clock, st: r.shared, id: id, holder: store.OperationHolder(r.worker), keep: keep + time.Minute,
		log: newReqLog(r.log, zap.String("operation_id", id))}
}

// currentRecording reads the live recording of operation op's running attempt, or reports
// false when there is none: none begun yet, or one whose holder no longer holds the operation
// (taken over, or its lease ran out), which the store reads as aborted.
func (r *runner) currentRecording(op *store.Operation) (store.StreamPage, bool) {
	if r == nil || r.shared == nil || op.Status != store.StatusRunning {
		return store.StreamPage{}, false
	}
	page, err := r.shared.ReadEvents([]byte(op.ID), 0, 0)
	if err != nil || page.State != store.StreamLive {
		return store.StreamPage{}, false
	}
	return page, true
}

func (o *opRecording) begin(status int, header http.Header) {
	if o == nil {
		return
	}
	o.live = newLiveStream(o.st, []byte(o.id), o.holder, status, header, o.keep)
	go o.live.appendEvents(o.log)
}

func (o *opRecording) add(events []store.StreamEvent) {
	if o != nil && o.live != nil && len(events) > 0 {
		o.live.add(events)
	}
}

// end finishes the recording when the attempt's answer was whole and every event is stored,
// else aborts it; followers elsewhere then see the stream end the same way. A finished
// recording is kept a minute: by then the operation's stored result answers.
func (o *opRecording) end(whole bool) {
	if o == nil || o.live == nil {
		return
	}
	if o.live.drain() && whole {
		err := o.st.FinishStream([]byte(o.id), o.holder, o.clock.Now().Add(time.Minute))
		if err == nil {
			return
		}
		o.log.Warn("finishing the recording of the operation's stream", zap.Error(err))
	}
	if err := o.st.AbortStream([]byte(o.id), o.holder); err != nil {
		o.log.Warn("ending the recording of the operation's stream", zap.Error(err))
	}
}

// followStored returns operation op's live stream as recorded in a shared store, from another
// replica than the one running it, with the page that found it; nil when there is none. It
// breaks off when the store reads it as aborted: the upstream broke off, or the operation
// stopped running under the holder that recorded it (a takeover after that replica died).
func (r *runner) followStored(op *store.Operation) (*storedStream, store.StreamPage) {
	page, ok := r.currentRecording(op)
	if !ok {
		return nil, page
	}
	return &storedStream{st: r.shared, stream: []byte(op.ID), token: page.Token}, page
}

// storedProgress is the progress of operation op's stream as recorded in a shared store, or
// nil.
func (r *runner) storedProgress(op *store.Operation) *progressView {
	page, ok := r.currentRecording(op)
	if !ok {
		return nil
	}
	return &progressView{Events: int(page.Events), Bytes: page.Bytes}
}

package module

import (
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/sse"
	"github.com/mulligan-gw/mulligan/store"
)

// How a live stream ended, as its joiners see it.
type streamEnd uint8

const (
	streamOpen     streamEnd = iota // still live
	streamWhole                     // the upstream finished and the stream is recorded
	streamBrokeOff                  // the upstream broke off, or the stream could not be recorded
)

const (
	// maxPendingBytes bounds the events of one stream waiting to be written to the store: past
	// it the relay waits for the store, so memory per stream stays small however long it runs.
	maxPendingBytes = 1 << 20
	// readPage is how many recorded events a joiner reads from the store at a time.
	readPage = 64
)

// liveStream is an event stream being recorded by this process (a keyed request's, or an
// operation's: opRecording): the in-memory broadcast a keyed stream's joiners follow, and the
// queue of events on their way to the store. Events up to committed are in the store; the ones
// after it, up to total, are pending here.
type liveStream struct {
	stream []byte             // the stream's id: the record key, or the operation's id
	holder store.StreamHolder // the attempt recorded, and its fence
	status int
	header http.Header
	keep   time.Duration // how long the store keeps the events
	st     store.StreamRecorder

	mu           sync.Mutex
	changed      chan struct{} // closed and replaced at every change
	committed    uint64
	pending      []store.StreamEvent
	pendingBytes int
	total        uint64
	recording    bool // false once the stream cannot be recorded whole (max_result, storage)
	closing      bool // no more events: the appender drains and stops
	end          streamEnd
	appenderDone chan struct{}
}

func newLiveStream(st store.StreamRecorder, stream []byte, holder store.StreamHolder, status int, header http.Header, keep time.Duration) *liveStream {
	return &liveStream{stream: stream, holder: holder, status: status, header: header, keep: keep, st: st,
		changed: make(chan struct{}), recording: true, appenderDone: make(chan struct{})}
}

// notify wakes everyone waiting on a change; mu is held.
func (l *liveStream) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// add queues events for the store and the joiners, waiting while too much is pending.
func (l *liveStream) add(events []store.StreamEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.recording && l.pendingBytes > maxPendingBytes {
		ch := l.changed
		l.mu.Unlock()
		<-ch
		l.mu.Lock()
	}
	if !l.recording {
		return
	}
	for _, e := range events {
		l.total++
		e.Seq = l.total
		l.pending = append(l.pending, e)
		l.pendingBytes += len(e.Data)
	}
	l.notify()
}

// stopRecording gives up on recording the stream (it passed max_result, or storage failed):
// it is relayed on to its first client, but joiners see it end now.
func (l *liveStream) stopRecording() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.recording {
		l.recording, l.pending, l.pendingBytes = false, nil, 0
		l.notify()
	}
}

// appendEvents begins the stream in the store, then writes pending events in batches until
// the stream closes: one transaction for whatever queued up during the previous write. It runs
// beside the relay, so the first event reaches the client without waiting for the store.
func (l *liveStream) appendEvents(log reqLog) {
	begun := false
	defer func() {
		// A stream no longer recorded is dropped from the store at once, so that joiners
		// following it there (on other replicas) see it end and new duplicates do not join it.
		l.mu.Lock()
		stopped := !l.recording
		l.mu.Unlock()
		if begun && stopped {
			if err := l.st.DropStream(l.stream, l.holder); err != nil {
				log.Warn("dropping the recording of a stream no longer recorded", zap.Error(err))
			}
		}
		close(l.appenderDone)
	}()
	err := l.st.BeginStream(l.stream, l.holder, l.status, l.header, l.keep)
	begun = err == nil
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		log.Warn("starting a stream recording; the stream will not replay", zap.Error(err))
		l.recording, l.pending, l.pendingBytes = false, nil, 0
		l.notify()
		return
	}
	for {
		if len(l.pending) == 0 || !l.recording {
			if l.closing || !l.recording {
				return
			}
			ch := l.changed
			l.mu.Unlock()
			<-ch
			l.mu.Lock()
			continue
		}
		batch := l.pending
		l.mu.Unlock()
		err := l.st.AppendEvents(l.stream, l.holder, batch)
		l.mu.Lock()
		if err != nil {
			log.Warn("recording stream events; the stream will not replay", zap.Error(err))
			l.recording, l.pending, l.pendingBytes = false, nil, 0
			l.notify()
			return
		}
		if !l.recording {
			return
		}
		l.committed += uint64(len(batch))
		for _, e := range batch {
			l.pendingBytes -= len(e.Data)
		}
		l.pending = l.pending[len(batch):]
		l.notify()
	}
}

// drain closes the stream to new events and waits until the appender has written the pending
// ones; it reports whether everything was recorded.
func (l *liveStream) drain() bool {
	l.mu.Lock()
	l.closing = true
	l.notify()
	l.mu.Unlock()
	<-l.appenderDone
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recording && l.committed == l.total
}

// finish tells the joiners how the stream ended.
func (l *liveStream) finish(end streamEnd) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.end = end
	if end == streamBrokeOff {
		l.recording = false
	}
	l.notify()
}

// joinable reports whether a duplicate may follow the stream: it is live and still recorded.
func (l *liveStream) joinable() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recording && l.end == streamOpen
}

// next implements eventSource for a joiner at cursor: recorded events come from the store,
// pending ones from memory.
func (l *liveStream) next(cursor uint64) ([]store.StreamEvent, streamEnd, <-chan struct{}, error) {
	l.mu.Lock()
	switch {
	case !l.recording && l.end != streamWhole:
		l.mu.Unlock()
		return nil, streamBrokeOff, nil, nil
	case cursor < l.committed:
		limit := int(min(l.committed-cursor, readPage))
		l.mu.Unlock()
		page, err := l.st.ReadEvents(l.stream, cursor, limit)
		if err == nil && len(page.List) == 0 {
			return nil, streamBrokeOff, nil, nil // deleted meanwhile: the stream was aborted
		}
		return page.List, streamOpen, nil, err
	case cursor < l.total:
		evs := l.pending[cursor-l.committed:]
		l.mu.Unlock()
		return evs[:min(len(evs), readPage)], streamOpen, nil, nil
	case l.end != streamOpen:
		l.mu.Unlock()
		return nil, l.end, nil, nil
	}
	defer l.mu.Unlock()
	return nil, streamOpen, l.changed, nil
}

// find implements eventSource: the position of the event with id, pending or recorded.
func (l *liveStream) find(id string) (uint64, bool) {
	l.mu.Lock()
	for _, e := range l.pending {
		if e.ID == id {
			l.mu.Unlock()
			return e.Seq, true
		}
	}
	l.mu.Unlock() // checked before the store: an event leaves pending only once it is stored
	seq, ok, err := l.st.FindEvent(l.stream, id)
	return seq, ok && err == nil
}

// liveStreams are the keyed streams this process relays, by record key, for joiners to find.
type liveStreams struct {
	mu sync.Mutex
	m  map[string]*liveStream
}

func newLiveStreams() *liveStreams { return &liveStreams{m: map[string]*liveStream{}} }

func (s *liveStreams) add(l *liveStream) {
	s.mu.Lock()
	s.m[string(l.stream)] = l
	s.mu.Unlock()
}

func (s *liveStreams) remove(l *liveStream) {
	s.mu.Lock()
	if s.m[string(l.stream)] == l {
		delete(s.m, string(l.stream))
	}
	s.mu.Unlock()
}

func (s *liveStreams) get(key []byte) *liveStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[string(key)]
}

// streamRecording is the keyed run's side of a stream: it is opened when the upstream answers
// with Server-Sent Events, gives every event an id, relays it to the client at once, and hands
// it to the liveStream; at the end it finishes or aborts the recording.
type streamRecording struct {
	g     *gate
	kr    *keyedRequest
	st    store.StreamRecorder
	token string
	tee   *capture.Tee
	live  *liveStream
	split sse.Splitter
	seq   uint64
	bytes int64
	ended bool // end or abandon ran: the recording is finished or aborted
}

// newStreamRecording prepares tee to record an event-stream answer event by event (every
// backend records streams: store.StreamRecorder).
func (g *gate) newStreamRecording(tee *capture.Tee, kr *keyedRequest, st store.Backend, token string) *streamRecording {
	rec := &streamRecording{g: g, kr: kr, token: token, tee: tee}
	rec.st, tee.Streams = st, rec
	return rec
}

// Open starts recording when the answer is an event stream the policy records; it reports
// whether it did. A stream the store cannot record is relayed unrecorded (the key is then
// released at the end).
func (r *streamRecording) Open(status int, header http.Header) bool {
	if !r.g.policy.records(status) || !sse.IsEventStream(header.Get("Content-Type")) {
		return false
	}
	header.Del("Content-Length") // ids are added: the length changes
	r.tee.Client().Header().Del("Content-Length")
	keep := r.g.lease + r.g.ttl + time.Minute // the record replays for ttl after the stream ends
	r.live = newLiveStream(r.st, r.kr.recordKey, store.KeyHolder(r.token), status, header, keep)
	r.g.streams.add(r.live)
	r.g.flights.began(string(r.kr.recordKey), r.token) // duplicates waiting here join it now
	go r.live.appendEvents(r.kr.log)
	return true
}

// Write splits upstream bytes into events and relays each with its id. What one upstream
// write completed is flushed at once: a live upstream sends its events one write at a time.
//
// The events are handed to the live stream before the client sees them: a client that drops
// and comes back at once with Last-Event-ID must find the event it names.
func (r *streamRecording) Write(p []byte) {
	var batch []store.StreamEvent
	var relay [][]byte
	r.split.Push(p, func(block []byte) {
		r.seq++
		data, id := sse.WithEventID(block, r.seq)
		relay = append(relay, data)
		r.bytes += int64(len(data))
		if r.bytes > r.g.maxResult {
			r.live.stopRecording() // relayed, not recorded (docs/streams.md)
			return
		}
		batch = append(batch, store.StreamEvent{ID: id, Data: data})
	})
	if len(batch) > 0 {
		r.live.add(batch)
	}
	for _, data := range relay {
		r.tee.ToClient(data)
	}
	if int64(r.split.Buffered()) > r.g.maxResult { // one event larger than a whole record
		r.live.stopRecording()
		r.tee.ToClient(r.split.Rest())
	}
	r.tee.FlushClient()
}

// end ends the stream: recorded whole and finished when the upstream ended it (err nil), else
// aborted, which releases the key at once.
func (r *streamRecording) end(err error) error {
	r.ended = true
	if rest := r.split.Rest(); len(rest) > 0 {
		r.tee.ToClient(rest) // an unterminated last event is relayed, not recorded as one
		r.tee.FlushClient()
	}
	if err != nil || !r.live.drain() {
		r.abort()
		return err
	}
	expires := r.g.expiry()
	if ferr := r.st.FinishStream(r.kr.recordKey, r.live.holder, expires); ferr != nil {
		r.kr.log.Error("finishing a stream recording", zap.Error(ferr))
		r.abort()
		return err
	}
	r.tee.Client().Header().Set(headerExpires, expires.UTC().Format(http.TimeFormat)) // the trailer declared with the headers
	r.g.streams.remove(r.live)
	r.live.finish(streamWhole)
	r.kr.log.Debug("stream recorded for replay", zap.Uint64("events", r.seq), zap.Int64("bytes", r.bytes))
	return nil
}

// abandon runs when the run unwinds: an upstream that breaks off mid-stream makes the proxy
// panic with http.ErrAbortHandler, and the stream must end as broken at once. It reports
// whether the run was a stream, whose key it has then released.
func (r *streamRecording) abandon() bool {
	if r.live == nil {
		return false
	}
	if !r.ended {
		r.ended = true
		r.live.drain()
		r.abort()
	}
	return true
}

// abort releases the key first, so that a joiner retrying as soon as it sees the end runs
// the request afresh instead of finding the broken stream.
func (r *streamRecording) abort() {
	if err := r.st.AbortStream(r.kr.recordKey, r.live.holder); err != nil {
		r.kr.log.Warn("releasing the key of a broken stream", zap.Error(err))
	}
	r.g.streams.remove(r.live)
	r.live.finish(streamBrokeOff)
	r.kr.log.Debug("stream not recorded; key released", zap.Uint64("events", r.seq))
}

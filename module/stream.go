package module

import (
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/sse"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
)

// liveStreams are the keyed streams this process relays, by record key, for joiners to find.
type liveStreams struct {
	mu sync.Mutex
	m  map[string]*streams.Live
}

func newLiveStreams() *liveStreams { return &liveStreams{m: map[string]*streams.Live{}} }

func (s *liveStreams) add(l *streams.Live) {
	s.mu.Lock()
	s.m[string(l.ID())] = l
	s.mu.Unlock()
}

func (s *liveStreams) remove(l *streams.Live) {
	s.mu.Lock()
	if s.m[string(l.ID())] == l {
		delete(s.m, string(l.ID()))
	}
	s.mu.Unlock()
}

func (s *liveStreams) get(key []byte) *streams.Live {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[string(key)]
}

// streamRecording is the keyed run's side of a stream: it is opened when the upstream answers
// with Server-Sent Events, gives every event an id, relays it to the client at once, and hands
// it to the streams.Live; at the end it finishes or aborts the recording.
type streamRecording struct {
	g     *gate
	kr    *keyedRequest
	st    store.StreamRecorder
	token string
	tee   *capture.Tee
	live  *streams.Live
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
	r.live = streams.NewLive(r.st, r.kr.recordKey, store.KeyHolder(r.token), status, header, keep)
	r.g.streams.add(r.live)
	r.g.flights.Began(string(r.kr.recordKey), r.token) // duplicates waiting here join it now
	go r.live.AppendEvents(r.kr.log)
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
			r.live.StopRecording() // relayed, not recorded (docs/streams.md)
			return
		}
		batch = append(batch, store.StreamEvent{ID: id, Data: data})
	})
	if len(batch) > 0 {
		r.live.Add(batch)
	}
	for _, data := range relay {
		r.tee.ToClient(data)
	}
	if int64(r.split.Buffered()) > r.g.maxResult { // one event larger than a whole record
		r.live.StopRecording()
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
	if err != nil || !r.live.Drain() {
		r.abort()
		return err
	}
	expires := r.g.expiry()
	if ferr := r.st.FinishStream(r.kr.recordKey, r.live.Holder(), expires); ferr != nil {
		r.kr.log.Error("finishing a stream recording", zap.Error(ferr))
		r.abort()
		return err
	}
	r.tee.Client().Header().Set(headerExpires, expires.UTC().Format(http.TimeFormat)) // the trailer declared with the headers
	r.g.streams.remove(r.live)
	r.live.Finish(streams.Whole)
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
		r.live.Drain()
		r.abort()
	}
	return true
}

// abort releases the key first, so that a joiner retrying as soon as it sees the end runs
// the request afresh instead of finding the broken stream.
func (r *streamRecording) abort() {
	if err := r.st.AbortStream(r.kr.recordKey, r.live.Holder()); err != nil {
		r.kr.log.Warn("releasing the key of a broken stream", zap.Error(err))
	}
	r.g.streams.remove(r.live)
	r.live.Finish(streams.BrokeOff)
	r.kr.log.Debug("stream not recorded; key released", zap.Uint64("events", r.seq))
}

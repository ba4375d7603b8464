package streams

import (
	"net/http"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/sse"
	"github.com/mulligan-gw/mulligan/store"
)

// Lives are the keyed streams this process records, by record key, for duplicates to join.
type Lives struct {
	mu sync.Mutex
	m  map[string]*Live
}

// NewLives returns an empty set.
func NewLives() *Lives { return &Lives{m: map[string]*Live{}} }

func (s *Lives) add(l *Live) {
	s.mu.Lock()
	s.m[string(l.ID())] = l
	s.mu.Unlock()
}

func (s *Lives) remove(l *Live) {
	s.mu.Lock()
	if s.m[string(l.ID())] == l {
		delete(s.m, string(l.ID()))
	}
	s.mu.Unlock()
}

// Get returns the stream recorded here for key, or nil.
func (s *Lives) Get(key []byte) *Live {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[string(key)]
}

// Keyed is what every keyed stream of a block is recorded with.
type Keyed struct {
	Records  func(status int) bool // whether the block records an answer of this status
	Keep     time.Duration         // how long the store keeps a live stream's events
	MaxBytes int64                 // max_result: a longer stream is relayed, not recorded
	Expiry   func() time.Time      // until when a stream finished now replays
	Lives    *Lives
	Flights  *Flights
}

// Client is the client's side of a keyed run's answer (capture.Tee): its writer, and relaying
// bytes to it at once.
type Client interface {
	Client() http.ResponseWriter
	ToClient(p []byte)
	FlushClient()
}

// RecordLogger is where a recording tells what happened to it.
type RecordLogger interface {
	Logger
	Debug(msg string, fields ...zap.Field)
	Error(msg string, fields ...zap.Field)
}

// Recording is a keyed run's side of a stream (a capture.Sink): it opens when the upstream
// answers with Server-Sent Events, gives every event an id, relays it to the client at once, and
// hands it to the Live; at the end it finishes or aborts the recording.
type Recording struct {
	cfg   *Keyed
	key   []byte
	token string
	st    store.StreamRecorder
	to    Client
	log   RecordLogger
	live  *Live
	split sse.Splitter
	seq   uint64
	bytes int64
	ended bool // End or Abandon ran: the recording is finished or aborted
}

// Record prepares the recording of key's answer, claimed with token, in st.
func (k *Keyed) Record(st store.StreamRecorder, key []byte, token string, to Client, log RecordLogger) *Recording {
	return &Recording{cfg: k, key: key, token: token, st: st, to: to, log: log}
}

// Open starts recording when the answer is an event stream the policy records; it reports
// whether it did.
func (r *Recording) Open(status int, header http.Header) bool {
	if !r.cfg.Records(status) || !sse.IsEventStream(header.Get("Content-Type")) {
		return false
	}
	header.Del("Content-Length") // ids are added: the length changes
	r.to.Client().Header().Del("Content-Length")
	r.live = NewLive(r.st, r.key, store.KeyHolder(r.token), status, header, r.cfg.Keep)
	r.cfg.Lives.add(r.live)
	r.cfg.Flights.Began(string(r.key), r.token) // duplicates waiting here join it now
	go r.live.AppendEvents(r.log)
	return true
}

// Write splits upstream bytes into events and relays each with its id. What one upstream
// write completed is flushed at once: a live upstream sends its events one write at a time.
//
// The events are handed to the live stream before the client sees them: a client that drops
// and comes back at once with Last-Event-ID must find the event it names.
func (r *Recording) Write(p []byte) {
	var batch []store.StreamEvent
	var relay [][]byte
	r.split.Push(p, func(block []byte) {
		r.seq++
		data, id := sse.WithEventID(block, r.seq)
		relay = append(relay, data)
		r.bytes += int64(len(data))
		if r.bytes > r.cfg.MaxBytes {
			r.live.StopRecording() // relayed, not recorded (docs/streams.md)
			return
		}
		batch = append(batch, store.StreamEvent{ID: id, Data: data})
	})
	if len(batch) > 0 {
		r.live.Add(batch)
	}
	for _, data := range relay {
		r.to.ToClient(data)
	}
	if int64(r.split.Buffered()) > r.cfg.MaxBytes { // one event larger than a whole record
		r.live.StopRecording()
		r.to.ToClient(r.split.Rest())
	}
	r.to.FlushClient()
}

// End ends the stream: recorded whole and finished when the upstream ended it (err nil), else
// aborted, which releases the key at once. It returns when the stream replays until, zero when
// it was aborted, and err.
func (r *Recording) End(err error) (time.Time, error) {
	r.ended = true
	if rest := r.split.Rest(); len(rest) > 0 {
		r.to.ToClient(rest) // an unterminated last event is relayed, not recorded as one
		r.to.FlushClient()
	}
	if err != nil || !r.live.Drain() {
		r.abort()
		return time.Time{}, err
	}
	expires := r.cfg.Expiry()
	if ferr := r.st.FinishStream(r.key, r.live.Holder(), expires); ferr != nil {
		r.log.Error("finishing a stream recording", zap.Error(ferr))
		r.abort()
		return time.Time{}, err
	}
	r.cfg.Lives.remove(r.live)
	r.live.Finish(Whole)
	r.log.Debug("stream recorded for replay", zap.Uint64("events", r.seq), zap.Int64("bytes", r.bytes))
	return expires, nil
}

// Abandon runs when the run unwinds: an upstream that breaks off mid-stream makes the proxy
// panic with http.ErrAbortHandler, and the stream must end as broken at once. It reports
// whether the run was a stream, whose key it has then released.
func (r *Recording) Abandon() bool {
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
func (r *Recording) abort() {
	if err := r.st.AbortStream(r.key, r.live.Holder()); err != nil {
		r.log.Warn("releasing the key of a broken stream", zap.Error(err))
	}
	r.cfg.Lives.remove(r.live)
	r.live.Finish(BrokeOff)
	r.log.Debug("stream not recorded; key released", zap.Uint64("events", r.seq))
}

// Joined is the stream a duplicate of a keyed request follows, with the answer's head.
type Joined struct {
	Source  Source
	Status  int
	Header  http.Header
	Expires time.Time // zero while the stream is live
}

// Join finds the stream of key's current attempt for a duplicate whose claim found it replaying
// or in progress: finished (a replay), live in this process (the broadcast), or live elsewhere
// (the store). false: the key has no stream to join.
func (k *Keyed) Join(st store.StreamRecorder, key []byte, claim store.Claim, clock clockwork.Clock) (Joined, bool) {
	switch claim.Outcome {
	case store.Replay:
		rec := claim.Record
		if !rec.Streamed {
			return Joined{}, false
		}
		page, err := st.ReadEvents(key, 0, 0)
		if err != nil || page.State != store.StreamFinished {
			return Joined{}, false
		}
		return Joined{Source: NewStored(st, key, page.Token, clock), Status: rec.Response.Status, Header: rec.Response.Header, Expires: rec.ExpiresAt}, true
	case store.InProgress:
		if l := k.Lives.Get(key); l != nil && l.Holder().Token == claim.Record.Token {
			status, header := l.Head()
			return Joined{Source: l, Status: status, Header: header}, l.Joinable()
		}
		page, err := st.ReadEvents(key, 0, 0)
		if err != nil || page.Token != claim.Record.Token || (page.State != store.StreamLive && page.State != store.StreamFinished) {
			return Joined{}, false
		}
		return Joined{Source: NewStored(st, key, page.Token, clock), Status: page.Status, Header: page.Header}, true
	}
	return Joined{}, false
}

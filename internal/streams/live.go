package streams

import (
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
)

// Logger is where a recording's trouble is told.
type Logger interface {
	Warn(msg string, fields ...zap.Field)
}

// Live is an event stream being recorded by this process (a keyed request's, or an
// operation's on storage replicas share): the in-memory broadcast its followers here read,
// and the queue of events on their way to the store, written by an appender beside the relay,
// a transaction for whatever queued up during the previous write. Events up to committed are
// in the store; the ones after it, up to total, are pending here.
//
// The appender runs only while events are pending: it stops once it has written them all, and
// Add starts it again. A stream whose upstream is quiet (a model thinking, a held answer)
// holds no goroutine of its own, only its queue's state (docs/streams.md, "How it works").
type Live struct {
	stream []byte             // the stream's id: the record key, or the operation's id
	holder store.StreamHolder // the attempt recorded, and its fence
	status int
	header http.Header
	keep   time.Duration // how long the store keeps the events
	st     store.StreamRecorder

	mu           sync.Mutex
	log          Logger // set by Begin
	changes      changes
	committed    uint64
	pending      []store.StreamEvent
	pendingBytes int
	total        uint64
	recording    bool // false once the stream cannot be recorded whole (max_result, storage)
	begun        bool // BeginStream succeeded: the store holds the stream
	dropped      bool // a stream no longer recorded was dropped from the store
	appending    bool // an appender runs: set under mu when one is started, cleared as it stops
	end          End
}

// NewLive returns the recording of stream by holder in st, with the answer's head, kept keep
// in the store. Begin begins it there.
func NewLive(st store.StreamRecorder, stream []byte, holder store.StreamHolder, status int, header http.Header, keep time.Duration) *Live {
	return &Live{stream: stream, holder: holder, status: status, header: header, keep: keep, st: st,
		changes: newChanges(), recording: true}
}

// ID is the stream's id in the store.
func (l *Live) ID() []byte { return l.stream }

// Holder is the attempt recorded.
func (l *Live) Holder() store.StreamHolder { return l.holder }

// Head returns the answer's status and headers.
func (l *Live) Head() (int, http.Header) { return l.status, l.header }

// Begin starts the recording: an appender begins the stream in the store, beside the relay, so
// the first event reaches the client without waiting for the store, then writes whatever Add
// queued meanwhile. Trouble recording is told to log.
func (l *Live) Begin(log Logger) {
	l.mu.Lock()
	l.log = log
	l.appending = true
	l.mu.Unlock()
	go l.appendEvents(true)
}

// Add queues events for the store and the followers, waiting while too much is pending.
func (l *Live) Add(events []store.StreamEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.recording && l.pendingBytes > maxPendingBytes {
		l.waitLocked()
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
	l.changes.notify()
	l.startLocked()
}

// StopRecording gives up on recording the stream (it passed max_result, or storage failed):
// it is relayed on to its first client, but followers see it end now.
func (l *Live) StopRecording() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.recording {
		l.recording, l.pending, l.pendingBytes = false, nil, 0
		l.changes.notify()
		l.startLocked() // to drop it from the store
	}
}

// waitLocked waits for the next change; mu is held, and released meanwhile.
func (l *Live) waitLocked() {
	ch := l.changes.ch
	l.mu.Unlock()
	<-ch
	l.mu.Lock()
}

// startLocked starts an appender when there is work for one and none runs: events pending, or
// a stream no longer recorded to drop from the store. Before Begin it does nothing: Begin's
// appender begins the stream, then takes whatever is there. mu is held.
func (l *Live) startLocked() {
	if l.appending || l.log == nil {
		return
	}
	if len(l.pending) > 0 || (!l.recording && l.begun && !l.dropped) {
		l.appending = true
		go l.appendEvents(false)
	}
}

// appendEvents is the appender: with begin it first begins the stream in the store, then it
// writes pending events in batches until none is pending, and stops. A stream no longer
// recorded is dropped from the store at once, so that followers reading it there (on other
// replicas) see it end and new duplicates do not join it.
func (l *Live) appendEvents(begin bool) {
	if begin {
		err := l.st.BeginStream(l.stream, l.holder, l.status, l.header, l.keep)
		l.mu.Lock()
		if err != nil {
			l.log.Warn("starting a stream recording; the stream will not replay", zap.Error(err))
			l.recording, l.pending, l.pendingBytes = false, nil, 0
		}
		l.begun = err == nil
	} else {
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	for {
		if !l.recording {
			if l.begun && !l.dropped {
				l.dropped = true
				l.mu.Unlock()
				err := l.st.DropStream(l.stream, l.holder)
				l.mu.Lock()
				if err != nil {
					l.log.Warn("dropping the recording of a stream no longer recorded", zap.Error(err))
				}
			}
			break
		}
		if len(l.pending) == 0 {
			break
		}
		batch := l.pending
		l.mu.Unlock()
		err := l.st.AppendEvents(l.stream, l.holder, batch)
		l.mu.Lock()
		if err != nil {
			l.log.Warn("recording stream events; the stream will not replay", zap.Error(err))
			l.recording, l.pending, l.pendingBytes = false, nil, 0
			l.changes.notify()
			continue // to drop it
		}
		if !l.recording {
			continue
		}
		l.committed += uint64(len(batch))
		for _, e := range batch {
			l.pendingBytes -= len(e.Data)
		}
		l.pending = l.pending[len(batch):]
		if len(l.pending) == 0 {
			l.pending = nil // the batches' array goes with them
		}
		l.changes.notify()
	}
	l.appending = false
	l.changes.notify()
}

// Drain waits until the appender has written the pending events; it reports whether
// everything was recorded. No event is added after it.
func (l *Live) Drain() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.appending {
		l.waitLocked()
	}
	return l.recording && l.committed == l.total
}

// Finish tells the followers how the stream ended.
func (l *Live) Finish(end End) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.end = end
	if end == BrokeOff {
		l.recording = false
	}
	l.changes.notify()
}

// Joinable reports whether a duplicate may follow the stream: it is live and still recorded.
func (l *Live) Joinable() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recording && l.end == Open
}

// Next implements Source: recorded events come from the store, pending ones from memory.
func (l *Live) Next(cursor uint64) ([]store.StreamEvent, End, <-chan struct{}, error) {
	l.mu.Lock()
	switch {
	case !l.recording && l.end != Whole:
		l.mu.Unlock()
		return nil, BrokeOff, nil, nil
	case cursor < l.committed:
		limit := int(min(l.committed-cursor, ReadPage))
		l.mu.Unlock()
		page, err := l.st.ReadEvents(l.stream, cursor, limit)
		if err == nil && len(page.List) == 0 {
			return nil, BrokeOff, nil, nil // deleted meanwhile: the stream was aborted
		}
		return page.List, Open, nil, err
	case cursor < l.total:
		evs := l.pending[cursor-l.committed:]
		l.mu.Unlock()
		return evs[:min(len(evs), ReadPage)], Open, nil, nil
	case l.end != Open:
		l.mu.Unlock()
		return nil, l.end, nil, nil
	}
	defer l.mu.Unlock()
	return nil, Open, l.changes.ch, nil
}

// Find implements Source: the position of the event with id, pending or recorded.
func (l *Live) Find(id string) (uint64, bool) {
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

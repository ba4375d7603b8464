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
// and the queue of events on their way to the store, written by one appender beside the relay
// (AppendEvents), a transaction for whatever queued up during the previous write. Events up to
// committed are in the store; the ones after it, up to total, are pending here.
type Live struct {
	stream []byte             // the stream's id: the record key, or the operation's id
	holder store.StreamHolder // the attempt recorded, and its fence
	status int
	header http.Header
	keep   time.Duration // how long the store keeps the events
	st     store.StreamRecorder

	mu           sync.Mutex
	changes      changes
	committed    uint64
	pending      []store.StreamEvent
	pendingBytes int
	total        uint64
	recording    bool // false once the stream cannot be recorded whole (max_result, storage)
	closing      bool // no more events: the appender drains and stops
	end          End
	appenderDone chan struct{}
}

// NewLive returns the recording of stream by holder in st, with the answer's head, kept keep
// in the store. AppendEvents begins it there.
func NewLive(st store.StreamRecorder, stream []byte, holder store.StreamHolder, status int, header http.Header, keep time.Duration) *Live {
	return &Live{stream: stream, holder: holder, status: status, header: header, keep: keep, st: st,
		changes: newChanges(), recording: true, appenderDone: make(chan struct{})}
}

// ID is the stream's id in the store.
func (l *Live) ID() []byte { return l.stream }

// Holder is the attempt recorded.
func (l *Live) Holder() store.StreamHolder { return l.holder }

// Head returns the answer's status and headers.
func (l *Live) Head() (int, http.Header) { return l.status, l.header }

// Add queues events for the store and the followers, waiting while too much is pending.
func (l *Live) Add(events []store.StreamEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.recording && l.pendingBytes > maxPendingBytes {
		ch := l.changes.ch
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
	l.changes.notify()
}

// StopRecording gives up on recording the stream (it passed max_result, or storage failed):
// it is relayed on to its first client, but followers see it end now.
func (l *Live) StopRecording() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.recording {
		l.recording, l.pending, l.pendingBytes = false, nil, 0
		l.changes.notify()
	}
}

// AppendEvents begins the stream in the store, then writes pending events in batches until
// the stream closes. It runs beside the relay, so the first event reaches the client without
// waiting for the store.
func (l *Live) AppendEvents(log Logger) {
	begun := false
	defer func() {
		// A stream no longer recorded is dropped from the store at once, so that followers
		// reading it there (on other replicas) see it end and new duplicates do not join it.
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
		l.changes.notify()
		return
	}
	for {
		if len(l.pending) == 0 || !l.recording {
			if l.closing || !l.recording {
				return
			}
			ch := l.changes.ch
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
			l.changes.notify()
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
		l.changes.notify()
	}
}

// Drain closes the stream to new events and waits until the appender has written the pending
// ones; it reports whether everything was recorded.
func (l *Live) Drain() bool {
	l.mu.Lock()
	l.closing = true
	l.changes.notify()
	l.mu.Unlock()
	<-l.appenderDone
	l.mu.Lock()
	defer l.mu.Unlock()
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

package streams

import (
	"net/http"
	"sync"

	"github.com/mulligan-gw/mulligan/internal/sse"
	"github.com/mulligan-gw/mulligan/store"
)

// Copier copies a Broadcast's stream elsewhere as it comes (an operation's stream into a store
// shared by replicas, for followers on the others): Begin with the answer's head, then Add
// with each run of events.
type Copier interface {
	Begin(status int, header http.Header)
	Add(events []store.StreamEvent)
}

// Broadcast is an event-stream answer held whole in memory, cut into events with ids the way
// every stream is relayed (sse.WithEventID), for the followers of this process: live while an
// attempt receives it, or rebuilt from a stored answer. It is what capture.Recorder writes an
// event-stream answer to (Open, Write).
type Broadcast struct {
	mu      sync.Mutex
	changes changes
	status  int
	header  http.Header
	split   sse.Splitter
	events  []store.StreamEvent
	bytes   int64
	end     End
	begun   chan struct{} // closed when an event-stream answer begins
	copy    Copier        // nil: none
}

// NewBroadcast returns an empty stream whose events copy also receives (nil for none).
func NewBroadcast(copy Copier) *Broadcast {
	return &Broadcast{changes: newChanges(), begun: make(chan struct{}), copy: copy}
}

// Open sets the answer's status and headers; it reports whether the answer is an event stream.
func (b *Broadcast) Open(status int, header http.Header) bool {
	if !sse.IsEventStream(header.Get("Content-Type")) {
		return false
	}
	b.mu.Lock()
	b.status, b.header = status, header
	b.changes.notify()
	b.mu.Unlock()
	if b.copy != nil {
		b.copy.Begin(status, header)
	}
	close(b.begun)
	return true
}

// Begun is closed when the answer begins as an event stream.
func (b *Broadcast) Begun() <-chan struct{} { return b.begun }

// Head returns the answer's status and headers.
func (b *Broadcast) Head() (int, http.Header) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.status, b.header
}

// Relayed is the whole answer as its events were relayed, ids included, and any unterminated
// rest: what a replay must give.
func (b *Broadcast) Relayed() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]byte, 0, b.bytes+int64(b.split.Buffered()))
	for _, e := range b.events {
		out = append(out, e.Data...)
	}
	return append(out, b.split.Partial()...)
}

// Write adds upstream bytes: each event they complete is numbered and published.
func (b *Broadcast) Write(p []byte) {
	b.mu.Lock()
	from := len(b.events)
	b.split.Push(p, func(block []byte) {
		data, id := sse.WithEventID(block, uint64(len(b.events)+1))
		b.events = append(b.events, store.StreamEvent{Seq: uint64(len(b.events) + 1), ID: id, Data: data})
		b.bytes += int64(len(data))
	})
	added := b.events[from:len(b.events):len(b.events)]
	b.changes.notify()
	b.mu.Unlock()
	if b.copy != nil && len(added) > 0 {
		b.copy.Add(added) // outside mu: it may wait for the store, and followers here need not
	}
}

// Finish ends the stream, once: Whole when the upstream ended it, else BrokeOff.
func (b *Broadcast) Finish(end End) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.end == Open {
		b.end = end
		b.changes.notify()
	}
}

// Started reports whether the answer has begun and is an event stream.
func (b *Broadcast) Started() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.status != 0
}

// Progress is how many events and bytes the stream has so far.
func (b *Broadcast) Progress() (events int, bytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.events), b.bytes
}

// Next implements Source.
func (b *Broadcast) Next(cursor uint64) ([]store.StreamEvent, End, <-chan struct{}, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case cursor < uint64(len(b.events)):
		evs := b.events[cursor:]
		return evs[:min(len(evs), ReadPage)], Open, nil, nil
	case b.end != Open:
		return nil, b.end, nil, nil
	}
	return nil, Open, b.changes.ch, nil
}

// Find implements Source.
func (b *Broadcast) Find(id string) (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.events {
		if e.ID == id {
			return e.Seq, true
		}
	}
	return 0, false
}

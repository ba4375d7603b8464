// Package streams holds the gateway's event streams (docs/streams.md): what a keyed request's
// or an operation's Server-Sent Events answer is while it runs, how it is recorded in the
// store, and how a follower reads it. A follower reads every stream the same way, through a
// Source: the in-memory broadcast of a stream this process relays (Broadcast, Live), or the
// store (Stored); Relay writes any Source to a client.
//
// It imports neither Caddy nor the gateway: the store is store.StreamRecorder, the clock is
// handed in.
package streams

import (
	"net/http"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/store"
)

// End is how a stream ended, as its followers see it.
type End uint8

const (
	Open     End = iota // still live
	Whole               // the upstream finished and the stream is recorded
	BrokeOff            // the upstream broke off, or the stream could not be recorded
)

const (
	// maxPendingBytes bounds the events of one stream waiting to be written to the store: past
	// it the relay waits for the store, so memory per stream stays small however long it runs.
	maxPendingBytes = 1 << 20
	// ReadPage is how many events a follower reads at a time.
	ReadPage = 64
	// PollInterval is how soon a follower polling the store looks again after events.
	PollInterval = 50 * time.Millisecond
	// MaxPollInterval caps the backoff of a follower polling a quiet stream: a stalled stream
	// with many followers on other replicas costs each of them two reads a second, not twenty.
	MaxPollInterval = 500 * time.Millisecond
)

// Source is where a follower reads a stream.
type Source interface {
	// Next returns events after cursor; with none, either how the stream ended or a channel
	// that is ready when it is worth asking again.
	Next(cursor uint64) ([]store.StreamEvent, End, <-chan struct{}, error)
	// Find returns the position of the event with the given id.
	Find(id string) (uint64, bool)
}

// changes is the signal of a stream held in memory: a channel closed and replaced at every
// change, so that any number of followers wait on one.
type changes struct{ ch chan struct{} }

func newChanges() changes { return changes{make(chan struct{})} }

// notify wakes everyone waiting on a change; the stream's lock is held.
func (c *changes) notify() {
	close(c.ch)
	c.ch = make(chan struct{})
}

// Stored follows a stream through the store alone, by short polling.
type Stored struct {
	st     store.StreamRecorder
	stream []byte // the stream's id
	token  string // the attempt followed: another attempt's stream is not this one
	clock  clockwork.Clock
	wait   time.Duration // before the next poll: PollInterval after events, doubling while quiet
}

// NewStored follows stream in st as recorded by the attempt token, polling on clock (nil: the
// real clock).
func NewStored(st store.StreamRecorder, stream []byte, token string, clock clockwork.Clock) *Stored {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &Stored{st: st, stream: stream, token: token, clock: clock}
}

// Next implements Source.
func (s *Stored) Next(cursor uint64) ([]store.StreamEvent, End, <-chan struct{}, error) {
	page, err := s.st.ReadEvents(s.stream, cursor, ReadPage)
	switch {
	case err != nil:
		return nil, Open, nil, err
	case page.Token != s.token:
		return nil, BrokeOff, nil, nil
	case len(page.List) > 0:
		s.wait = 0
		return page.List, Open, nil, nil
	case page.State == store.StreamFinished && cursor >= page.Events:
		return nil, Whole, nil, nil
	case page.State == store.StreamLive:
		s.wait = min(max(2*s.wait, PollInterval), MaxPollInterval)
		return nil, Open, s.tick(s.wait), nil
	}
	return nil, BrokeOff, nil, nil
}

// Wait is the follower's wait before its next poll of a quiet stream.
func (s *Stored) Wait() time.Duration { return s.wait }

// tick is ready after d on the clock.
func (s *Stored) tick(d time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	s.clock.AfterFunc(d, func() { close(ch) })
	return ch
}

// Find implements Source.
func (s *Stored) Find(id string) (uint64, bool) {
	seq, ok, err := s.st.FindEvent(s.stream, id)
	return seq, ok && err == nil
}

// Relay writes the stream's events after `after` as they come, each flushed, and reports
// whether the stream broke off. The caller then aborts the connection (panic with
// http.ErrAbortHandler, as the proxy does for the first client), so no client takes part of an
// answer for the whole. A follower that leaves only stops its own copy.
func Relay(w http.ResponseWriter, r *http.Request, src Source, after uint64) (broken bool) {
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for cursor := after; ; {
		evs, end, wait, err := src.Next(cursor)
		switch {
		case err != nil || end == BrokeOff:
			return true
		case end == Whole:
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

package store

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"time"
)

// StreamRecorder is what a recorded event stream needs of storage (docs/streams.md): the events
// of a keyed Server-Sent Events answer are appended one batch at a time while the answer is
// relayed, read back by position by those who join or replay it, and finished (the key then
// replays the stream) or aborted (the key is released). Every call names the stream by its
// idempotency record key; the writing calls also present the claim's token, so an attempt that
// lost its claim can never write into the next attempt's stream.
type StreamRecorder interface {
	// BeginStream starts the stream of the claim held under token, with the answer's status
	// and headers; its events are kept for at most keep.
	BeginStream(key []byte, token string, status int, header http.Header, keep time.Duration) error
	// AppendEvents appends events, numbered on from the last one appended.
	AppendEvents(key []byte, token string, events []StreamEvent) error
	// ReadEvents returns the stream's state and at most limit events after position after.
	ReadEvents(key []byte, after uint64, limit int) (StreamPage, error)
	// FindEvent returns the position of the event with the given id, if the stream has it.
	FindEvent(key []byte, id string) (uint64, bool, error)
	// FinishStream completes the key held under token: from then on it replays the stream,
	// until expires.
	FinishStream(key []byte, token string, expires time.Time) error
	// AbortStream ends the stream as broken and releases the key held under token at once.
	AbortStream(key []byte, token string) error
	// DropStream gives up recording a stream that is still being relayed (it passed
	// max_result, or a write failed): from then on it reads as aborted, so joiners everywhere
	// see it end and new duplicates do not join it, and its events are deleted; the key stays
	// claimed under token until the attempt ends (AbortStream then releases it).
	DropStream(key []byte, token string) error
}

// StreamState is where a recorded stream is in its life.
type StreamState uint8

const (
	// StreamNone: the key has no stream.
	StreamNone StreamState = iota
	// StreamLive: the upstream is still answering; more events may come.
	StreamLive
	// StreamFinished: the upstream ended the answer; the stream is whole and replays.
	StreamFinished
	// StreamAborted: the answer broke off (the upstream, the size limit, or a gateway that died
	// with its claim); what was recorded is never replayed as whole.
	StreamAborted
)

// StreamEvent is one event of a stream, as relayed.
type StreamEvent struct {
	// Seq is the event's position in the stream, from 1.
	Seq uint64
	// ID is the event's id as relayed (the upstream's, or the gateway's: Seq in decimal).
	ID string
	// Data is the event's bytes as relayed, its closing blank line included.
	Data []byte
}

// StreamPage is a stream's state with a page of its events.
type StreamPage struct {
	State StreamState
	// Token is the claim whose attempt the stream records.
	Token  string
	Status int
	Header http.Header
	// Events and Bytes count what was recorded so far.
	Events uint64
	Bytes  int64
	// List holds the events read, in order.
	List []StreamEvent
}

// ErrStreamNotLive answers a write to a stream that is not live under the given claim: it was
// finished, aborted, or replaced by another attempt.
var ErrStreamNotLive = errors.New("stream is not live under this claim")

// EncodeSegment appends the segment of events to dst.
func EncodeSegment(dst []byte, events []StreamEvent) []byte {
	size := 0
	for _, e := range events {
		size += len(e.ID) + len(e.Data) + 2*binary.MaxVarintLen32
	}
	dst = slices.Grow(dst, size)
	for _, e := range events {
		dst = appendBytes(appendBytes(dst, []byte(e.ID)), e.Data)
	}
	return dst
}

// DecodeSegment reads a segment whose first event is at position first and appends to out its
// events after position after, up to limit events in out.
func DecodeSegment(seg []byte, first, after uint64, limit int, out []StreamEvent) ([]StreamEvent, error) {
	d := &decoder{b: seg}
	for seq := first; len(d.b) > 0 && len(out) < limit; seq++ {
		id, data := d.bytes(), d.bytes()
		if d.err {
			return out, ErrCorrupt
		}
		if seq > after {
			out = append(out, StreamEvent{Seq: seq, ID: string(id), Data: data})
		}
	}
	return out, nil
}

package store

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"time"
)

// StreamRecorder is what a recorded event stream needs of storage (docs/streams.md): the events
// of a Server-Sent Events answer are appended one batch at a time while the answer is relayed,
// read back by position by those who join, follow or replay it, and finished or aborted. A
// stream is named by its own id (a keyed request's record key, or an operation's id) and every
// write presents its holder (StreamHolder), which the backend checks in the write's own
// transaction: an attempt that lost what it held can never write into the next attempt's stream.
type StreamRecorder interface {
	// BeginStream starts the stream of holder's attempt, with the answer's status and headers;
	// its events are kept for at most keep. An earlier attempt's stream under the same id is
	// replaced, only while holder holds (ErrNotHolder otherwise).
	BeginStream(stream []byte, holder StreamHolder, status int, header http.Header, keep time.Duration) error
	// AppendEvents appends events, numbered on from the last one appended.
	AppendEvents(stream []byte, holder StreamHolder, events []StreamEvent) error
	// ReadEvents returns the stream's state and at most limit events after position after. A
	// live stream whose holder no longer holds (the key's claim is gone or ran out of lease; the
	// operation no longer runs under the worker, or its lease ran out) reads as aborted.
	ReadEvents(stream []byte, after uint64, limit int) (StreamPage, error)
	// FindEvent returns the position of the event with the given id, if the stream has it.
	FindEvent(stream []byte, id string) (uint64, bool, error)
	// FinishStream marks the stream whole. For a keyed stream it also completes the key held
	// under holder.Token: from then on it replays the stream, until expires. An operation's
	// stream is only ended, and kept until expires at most (the runner stores the result).
	FinishStream(stream []byte, holder StreamHolder, expires time.Time) error
	// AbortStream ends the stream as broken and deletes its events; for a keyed stream it also
	// releases the key held under holder.Token at once. A holder that no longer holds changes
	// nothing (and gets no error).
	AbortStream(stream []byte, holder StreamHolder) error
	// DropStream gives up recording a stream that is still being relayed (it passed
	// max_result, or a write failed): from then on it reads as aborted, so joiners everywhere
	// see it end and new duplicates do not join it, and its events are deleted; a key stays
	// claimed until the attempt ends (AbortStream then releases it).
	DropStream(stream []byte, holder StreamHolder) error
}

// StreamHolder is who writes a recorded stream: the attempt, and the fence every write of it is
// checked against (docs/streams.md).
type StreamHolder struct {
	// Token names the attempt; its events are stored under it. For a keyed stream it is the
	// claim's token and the fence: the key must be in flight under it.
	Token string
	// Worker, for an operation's stream, is the fence: the operation (the stream's id) must be
	// running under this worker, as Change.Holder fences a transition. Empty for a keyed stream.
	Worker string
}

// KeyHolder is the holder of a keyed stream: the attempt holding the key's claim under token.
func KeyHolder(token string) StreamHolder { return StreamHolder{Token: token} }

// OperationHolder is the holder of one attempt of an operation's stream, run by worker: a
// fresh token per attempt, so an earlier attempt's events are never read as this one's.
func OperationHolder(worker string) StreamHolder {
	return StreamHolder{Token: NewToken(), Worker: worker}
}

// StreamState is where a recorded stream is in its life.
type StreamState uint8

const (
	// StreamNone: there is no such stream.
	StreamNone StreamState = iota
	// StreamLive: the upstream is still answering; more events may come.
	StreamLive
	// StreamFinished: the upstream ended the answer; the stream is whole and replays.
	StreamFinished
	// StreamAborted: the answer broke off (the upstream, the size limit, or a gateway that died
	// or lost what it held); what was recorded is never replayed as whole.
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
	// Token is the attempt the stream records (StreamHolder.Token).
	Token  string
	Status int
	Header http.Header
	// Events and Bytes count what was recorded so far.
	Events uint64
	Bytes  int64
	// List holds the events read, in order.
	List []StreamEvent
}

// ErrStreamNotLive answers a write to a stream that is not live under the given holder: it was
// finished, aborted, or replaced by another attempt.
var ErrStreamNotLive = errors.New("stream is not live under this holder")

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

package responses

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
)

// A background response's stream (docs/responses.md): sequence_number 0 is the response as
// created (response.queued), then the upstream's events as the running attempt records them,
// renumbered 1, 2, ... and carrying the gateway's id; live from the runner here or from the
// shared store, or replayed from the recorded answer once the response has finished. A
// follower of an attempt that is lost gets an error event (stream_attempt_lost) and the end
// of the stream: the next attempt's events never follow the lost one's.

// How long a follower whose attempt broke off waits for the response to settle before it
// reads the attempt as lost, how often it looks meanwhile, and how long a follower of a
// response waiting for a seat waits before it looks again (as a keyed stream's duplicate
// does, docs/streams.md).
const (
	settleWait = 2 * time.Second
	settlePoll = streams.PollInterval
	lookAgain  = time.Second
)

// Follow answers op's events on w after sequence number after (-1: all of them). The stream
// begins at once with the response as created, also while it waits for the runner or a seat.
// An error means nothing was written: a *FieldError (starting_after past the last event of
// a finished response) or the Store's.
func (rd *Reader) Follow(w http.ResponseWriter, op *store.Operation, after int64) error {
	if op.Status.Final() {
		src, total, release, err := rd.finalSource(op)
		if err != nil {
			return err
		}
		defer release()
		if after >= total {
			return &FieldError{Param: "starting_after", Message: "starting_after is past this response's last event (its stream has " +
				strconv.FormatInt(total, 10) + " events, numbered from 0)."}
		}
		rl := rd.newRelay(w, op, after)
		defer rl.close()
		rl.from(src)
		return nil
	}
	rl := rd.newRelay(w, op, after)
	defer rl.close()
	for {
		if op.Status.Final() {
			src, _, release, err := rd.finalSource(op)
			if err == nil {
				rl.from(src)
				release()
			}
			return nil
		}
		if src := rd.Store.Live(op); src != nil {
			rl.from(src)
			return nil
		}
		cur := rd.Store.AwaitAnswer(op)
		if cur == nil {
			return nil // the client left
		}
		if cur.Version == op.Version && !cur.Status.Final() && rd.Store.Live(cur) == nil {
			// Still waiting for a seat, or the waiters here are at their bound: look again
			// shortly, unless the client has left.
			select {
			case <-rd.Context.Done():
				return nil
			case <-rd.Clock.After(lookAgain):
			}
			if cur, _ = rd.Store.GetOperation(op.ID); cur == nil {
				return nil
			}
		}
		op = cur
	}
}

// finalSource is the stream of a finished op: its recorded answer's events, or, when it has
// none (it failed or was cancelled before its answer, or the upstream answered JSON), its
// final object as one terminal event; and how many events the stream has in all. The memory
// it holds (the answer and its copy as events) is reserved until release (Store.LoadResult).
func (rd *Reader) finalSource(op *store.Operation) (_ streams.Source, total int64, release func(), _ error) {
	res, release, err := rd.Store.LoadResult(op, 3)
	if err != nil {
		return nil, 0, release, err
	}
	s := streams.NewBroadcast(nil)
	// A cancelled or timed-out response keeps what its last attempt streamed (a 2xx stream):
	// its replay gives those events, then its final object, numbered as they were live.
	if res != nil && (op.Status == store.StatusSucceeded || res.Status/100 == 2) && s.Open(res.Status, res.Header) {
		s.Write(res.Body)
		s.Finish(streams.Whole)
		n, ended := Count(res.Body)
		if !ended {
			n++ // the relay ends it with the final object (relay.from)
		}
		return s, 1 + n, release, nil
	}
	release()
	release = func() {}
	o, err := rd.Object(op)
	if err != nil {
		return nil, 0, release, err
	}
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream")
	s.Open(http.StatusOK, h)
	s.Write(TerminalEvent(o, 0))
	s.Finish(streams.Whole)
	return s, 2, release, nil
}

// relay writes a response's stream after sequence number after: the queued event at once,
// then the events of a source, renumbered on.
type relay struct {
	rd      *Reader
	w       http.ResponseWriter
	rc      *http.ResponseController
	id      string
	after   int64
	seq     int64 // the next event's sequence number
	created int64
	final   bool // a terminal event was relayed

	mu        sync.Mutex // the writes: the relay's, and the keep-alive's
	closed    bool       // under mu: nothing writes after close
	keepAlive clockwork.Timer
	every     time.Duration
}

// newRelay answers the stream's head and its first event, response.queued, and keeps the
// stream alive until close.
func (rd *Reader) newRelay(w http.ResponseWriter, op *store.Operation, after int64) *relay {
	EventStreamHeader(w.Header())
	w.WriteHeader(http.StatusOK)
	rl := &relay{rd: rd, w: w, rc: http.NewResponseController(w), id: op.ID, after: after, created: op.SubmittedAt.Unix()}
	rl.send(QueuedEvent(Base(op.ID, rl.created, Queued, op.Echo)))
	_ = rl.flush()
	rl.every = rd.KeepAlive
	if rl.every <= 0 {
		rl.every = KeepAlive
	}
	// A timer, not a goroutine with a ticker: a stream waiting for its next event holds no
	// goroutine of its own for its keep-alive (docs/benchmarks.md, "Live streams' memory").
	// Set before newRelay returns: a fake clock's timer is set now.
	rl.mu.Lock()
	rl.keepAlive = rd.Clock.AfterFunc(rl.every, rl.keepAliveTick)
	rl.mu.Unlock()
	return rl
}

// keepAliveTick writes a comment and sets the next one, unless the relay is closed or the
// client left; a write that fails sets none.
func (rl *relay) keepAliveTick() {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.closed || rl.rd.Context.Err() != nil {
		return
	}
	rl.keepAlive.Reset(rl.every) // before the write: whoever reads the comment finds the next one set
	_, err := rl.w.Write(keepAliveComment)
	if err == nil {
		err = rl.rc.Flush()
	}
	if err != nil {
		rl.keepAlive.Stop()
	}
}

var keepAliveComment = []byte(": keep-alive\n\n")

// close ends the keep-alive: nothing writes to the stream after it.
func (rl *relay) close() {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	rl.closed = true
	rl.keepAlive.Stop()
}

// flush sends what was written.
func (rl *relay) flush() error {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return rl.rc.Flush()
}

// send writes the next event unless it is at or before after; false when the client is gone.
func (rl *relay) send(b []byte) bool {
	defer func() { rl.seq++ }()
	if rl.seq <= rl.after {
		return true
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	_, err := rl.w.Write(b)
	return err == nil
}

// from relays src's events as they come, each flushed; when src breaks off (the attempt was
// lost), an error event ends the stream.
func (rl *relay) from(src streams.Source) {
	for cursor := uint64(0); ; {
		evs, end, wait, err := src.Next(cursor)
		switch {
		case err != nil || end == streams.BrokeOff:
			ev := LostEvent(rl.seq)
			if o := rl.ended(); o != nil {
				ev = TerminalEvent(o, rl.seq)
			}
			if rl.send(ev) {
				_ = rl.flush()
			}
			return
		case end == streams.Whole:
			// An answer that ended without a terminal event (or whose last one was cut short,
			// which is no event) ends with the response's final object, as a poll reads it.
			if !rl.final {
				if o := rl.settled(); o != nil && rl.send(TerminalEvent(o, rl.seq)) {
					_ = rl.flush()
				}
			}
			return
		}
		for _, e := range evs {
			if e.Seq <= cursor {
				continue
			}
			cursor = e.Seq
			out, typ, ok := Event(e.Data, rl.seq, rl.id, rl.created)
			if !ok {
				continue
			}
			rl.final = rl.final || IsTerminal(typ)
			if !rl.send(out) {
				return
			}
		}
		if len(evs) > 0 {
			if rl.flush() != nil {
				return
			}
			continue
		}
		select {
		case <-wait:
		case <-rl.rd.Context.Done():
			return
		}
	}
}

// ended is, after the followed attempt broke off, the final object of a response that ended
// with it: cancelled (the cancel cut the call) or failed (no retry left). It is nil when the
// response goes on (another attempt runs, or will) or succeeded by another attempt: the
// follower then reads the attempt as lost.
func (rl *relay) ended() Object {
	return rl.await(func(op *store.Operation) (done, want bool) {
		if op.Status == store.StatusCanceled || op.Status == store.StatusFailed {
			return true, true
		}
		return op.Status.Final(), false
	})
}

// settled is, after the followed attempt's whole answer, the response's final object once it
// has settled; nil when it does not within settleWait, or the client left.
func (rl *relay) settled() Object {
	return rl.await(func(op *store.Operation) (done, want bool) {
		return op.Status.Final(), op.Status.Final()
	})
}

// await reads the response until settle reports it done, for settleWait at most, and returns
// its object when settle wants it; nil otherwise, or when the client left.
func (rl *relay) await(settle func(*store.Operation) (done, want bool)) Object {
	deadline := rl.rd.Clock.Now().Add(settleWait)
	for {
		op, err := rl.rd.Store.GetOperation(rl.id)
		if err != nil {
			return nil
		}
		if done, want := settle(op); done {
			if !want {
				return nil
			}
			o, err := rl.rd.Object(op)
			if err != nil {
				return nil
			}
			return o
		}
		if rl.rd.Clock.Now().After(deadline) {
			return nil
		}
		select {
		case <-rl.rd.Context.Done():
			return nil
		case <-rl.rd.Clock.After(settlePoll):
		}
	}
}

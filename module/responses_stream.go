package module

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/responses"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
)

// A background response's stream (docs/responses.md): sequence_number 0 is the response as
// created (response.queued), then the upstream's events as the running attempt records them,
// renumbered 1, 2, ... and carrying the gateway's id; live from the runner here or from the
// shared store, or replayed from the recorded answer once the response has finished. A
// follower of an attempt that is lost gets an error event (stream_attempt_lost) and the end
// of the stream: the next attempt's events never follow the lost one's.

// follow answers op's events after sequence number after (-1: all of them). The stream
// begins at once with the response as created, also while it waits for the runner or a seat.
func (a *respCall) follow(op *store.Operation, after int64) {
	if op.Status.Final() {
		src, total, release, err := a.finalSource(op)
		if err != nil {
			a.fail(err)
			return
		}
		defer release()
		if after >= total {
			a.invalid("starting_after is past this response's last event (its stream has "+strconv.FormatInt(total, 10)+" events, numbered from 0).", "starting_after")
			return
		}
		rl := a.newRelay(op, after)
		defer rl.close()
		rl.from(src)
		return
	}
	rl := a.newRelay(op, after)
	defer rl.close()
	q := &opsRequest{w: a.w, r: a.r, st: a.st, run: a.run, caller: a.caller, log: a.log}
	for {
		if op.Status.Final() {
			src, _, release, err := a.finalSource(op)
			if err == nil {
				rl.from(src)
				release()
			}
			return
		}
		if src := a.liveSource(op); src != nil {
			rl.from(src)
			return
		}
		cur := a.h.awaitAnswer(q, op)
		if cur == nil {
			return // the client left
		}
		if cur.Version == op.Version && !cur.Status.Final() && a.liveSource(cur) == nil {
			// Still waiting for a seat, or the waiters here are at their bound: look again
			// shortly, unless the client has left.
			select {
			case <-a.r.Context().Done():
				return
			case <-a.h.clock.After(streamPollMax):
			}
			if cur, _ = a.st.GetOperation(op.ID); cur == nil {
				return
			}
		}
		op = cur
	}
}

// liveSource is the running attempt's stream of op, here or on another replica; nil when
// none has begun.
func (a *respCall) liveSource(op *store.Operation) streams.Source {
	if s := a.run.streamOf(op.ID); s != nil {
		return s
	}
	if f, _ := a.run.followStored(op); f != nil {
		return f
	}
	return nil
}

// finalSource is the stream of a finished op: its recorded answer's events, or, when it has
// none (it failed or was cancelled before its answer, or the upstream answered JSON), its
// final object as one terminal event; and how many events the stream has in all. The memory
// it holds (the answer and its copy as events) is reserved until release (loadResult).
func (a *respCall) finalSource(op *store.Operation) (_ streams.Source, total int64, release func(), _ error) {
	res, release, err := a.loadResult(op, 3)
	if err != nil {
		return nil, 0, release, err
	}
	s := newOpStream()
	// A cancelled or timed-out response keeps what its last attempt streamed (a 2xx stream):
	// its replay gives those events, then its final object, numbered as they were live.
	if res != nil && (op.Status == store.StatusSucceeded || res.Status/100 == 2) && s.Open(res.Status, res.Header) {
		s.Write(res.Body)
		s.Finish(streams.Whole)
		n, ended := responses.Count(res.Body)
		if !ended {
			n++ // the relay ends it with the final object (relay.from)
		}
		return s, 1 + n, release, nil
	}
	release()
	release = func() {}
	o, err := a.object(op)
	if err != nil {
		return nil, 0, release, err
	}
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream")
	s.Open(http.StatusOK, h)
	s.Write(responses.TerminalEvent(o, 0))
	s.Finish(streams.Whole)
	return s, 2, release, nil
}

// relay writes a response's stream after sequence number after: the queued event at once,
// then the events of a source, renumbered on.
type relay struct {
	a       *respCall
	op      *store.Operation
	rc      *http.ResponseController
	after   int64
	seq     int64 // the next event's sequence number
	created int64
	final   bool // a terminal event was relayed

	mu      sync.Mutex // the writes: the relay's, and the keep-alive's
	stop    chan struct{}
	stopped sync.WaitGroup
}

// responseKeepAlive is how often a response's stream writes an SSE comment, which clients
// ignore, so that proxies with an idle timeout (often 60 s) keep it open while it waits for a
// seat or for a slow model's next event (docs/responses.md).
var responseKeepAlive = 15 * time.Second

// newRelay answers the stream's head and its first event, response.queued, and keeps the
// stream alive until close.
func (a *respCall) newRelay(op *store.Operation, after int64) *relay {
	responses.EventStreamHeader(a.w.Header())
	a.w.WriteHeader(http.StatusOK)
	rl := &relay{a: a, op: op, rc: http.NewResponseController(a.w), after: after, created: op.SubmittedAt.Unix(), stop: make(chan struct{})}
	rl.send(responses.QueuedEvent(responses.Base(op.ID, rl.created, responses.Queued, op.Echo)))
	_ = rl.flush()
	rl.stopped.Add(1)
	go rl.keepAlive()
	return rl
}

// keepAlive writes a comment every responseKeepAlive until close or the client leaves.
func (rl *relay) keepAlive() {
	defer rl.stopped.Done()
	t := rl.a.h.clock.NewTicker(responseKeepAlive)
	defer t.Stop()
	for {
		select {
		case <-rl.stop:
			return
		case <-rl.a.r.Context().Done():
			return
		case <-t.Chan():
			rl.mu.Lock()
			_, err := rl.a.w.Write([]byte(": keep-alive\n\n"))
			if err == nil {
				err = rl.rc.Flush()
			}
			rl.mu.Unlock()
			if err != nil {
				return
			}
		}
	}
}

// close ends the keep-alive: nothing writes to the stream after it.
func (rl *relay) close() {
	close(rl.stop)
	rl.stopped.Wait()
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
	_, err := rl.a.w.Write(b)
	return err == nil
}

// from relays src's events as they come, each flushed; when src breaks off (the attempt was
// lost), an error event ends the stream.
func (rl *relay) from(src streams.Source) {
	for cursor := uint64(0); ; {
		evs, end, wait, err := src.Next(cursor)
		switch {
		case err != nil || end == streams.BrokeOff:
			ev := responses.LostEvent(rl.seq)
			if o := rl.ended(); o != nil {
				ev = responses.TerminalEvent(o, rl.seq)
			}
			if rl.send(ev) {
				_ = rl.flush()
			}
			return
		case end == streams.Whole:
			// An answer that ended without a terminal event (or whose last one was cut short,
			// which is no event) ends with the response's final object, as a poll reads it.
			if !rl.final {
				if o := rl.settled(); o != nil && rl.send(responses.TerminalEvent(o, rl.seq)) {
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
			out, typ, ok := responses.Event(e.Data, rl.seq, rl.op.ID, rl.created)
			if !ok {
				continue
			}
			rl.final = rl.final || responses.IsTerminal(typ)
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
		case <-rl.a.r.Context().Done():
			return
		}
	}
}

// settleWait is how long a follower whose attempt broke off waits for the response to settle
// before it reads the attempt as lost.
const settleWait = 2 * time.Second

// ended is, after the followed attempt broke off, the final object of a response that ended
// with it: cancelled (the cancel cut the call) or failed (no retry left). It is nil when the
// response goes on (another attempt runs, or will) or succeeded by another attempt: the
// follower then reads the attempt as lost.
func (rl *relay) ended() responses.Object {
	deadline := rl.a.h.now().Add(settleWait)
	for {
		op, err := rl.a.st.GetOperation(rl.op.ID)
		switch {
		case err != nil:
			return nil
		case op.Status == store.StatusCanceled || op.Status == store.StatusFailed:
			o, err := rl.a.object(op)
			if err != nil {
				return nil
			}
			return o
		case op.Status.Final() || rl.a.h.now().After(deadline):
			return nil
		}
		select {
		case <-rl.a.r.Context().Done():
			return nil
		case <-rl.a.h.clock.After(pollInterval):
		}
	}
}

// settled is, after the followed attempt's whole answer, the response's final object once it
// has settled; nil when it does not within settleWait, or the client left.
func (rl *relay) settled() responses.Object {
	deadline := rl.a.h.now().Add(settleWait)
	for {
		op, err := rl.a.st.GetOperation(rl.op.ID)
		switch {
		case err != nil:
			return nil
		case op.Status.Final():
			o, err := rl.a.object(op)
			if err != nil {
				return nil
			}
			return o
		case rl.a.h.now().After(deadline):
			return nil
		}
		select {
		case <-rl.a.r.Context().Done():
			return nil
		case <-rl.a.h.clock.After(pollInterval):
		}
	}
}

// writeStored writes a stored answer.
func writeStored(w http.ResponseWriter, resp store.Response) { capture.WriteResponse(w, resp) }

// jsonBody is v as an answer's JSON body.
func jsonBody(v any) []byte {
	b, _ := json.Marshal(v)
	return append(b, '\n')
}

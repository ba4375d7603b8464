package module

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

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

// follow answers op's events after sequence number after (-1: all of them).
func (a *respCall) follow(op *store.Operation, after int64) {
	q := &opsRequest{w: a.w, r: a.r, st: a.st, run: a.run, caller: a.caller, log: a.log}
	for {
		if !op.Status.Final() {
			if src := a.liveSource(op); src != nil {
				a.relay(op, src, after)
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
			continue
		}
		src, total, err := a.finalSource(op)
		if err != nil {
			a.fail(err)
			return
		}
		if after >= total {
			a.invalid("starting_after is past this response's last event (its stream has "+strconv.FormatInt(total, 10)+" events, numbered from 0).", "starting_after")
			return
		}
		a.relay(op, src, after)
		return
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
// final object as one terminal event; and how many events the stream has in all.
func (a *respCall) finalSource(op *store.Operation) (streams.Source, int64, error) {
	var res *store.Response
	if op.Result != nil {
		var err error
		if res, err = a.st.LoadResult(op.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, 0, err
		}
	}
	s := newOpStream()
	if res != nil && op.Status == store.StatusSucceeded && s.Open(res.Status, res.Header) {
		s.Write(res.Body)
		s.Finish(streams.Whole)
		return s, 1 + responses.Count(res.Body), nil
	}
	o, err := a.object(op)
	if err != nil {
		return nil, 0, err
	}
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream")
	s.Open(http.StatusOK, h)
	s.Write(responses.TerminalEvent(o, 0))
	s.Finish(streams.Whole)
	return s, 2, nil
}

// relay writes op's stream after sequence number after: the queued event, then src's events
// as they come, each flushed; when src breaks off (the attempt was lost), an error event ends
// it.
func (a *respCall) relay(op *store.Operation, src streams.Source, after int64) {
	responses.EventStreamHeader(a.w.Header())
	a.w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(a.w)
	created := op.SubmittedAt.Unix()
	seq := int64(0)
	send := func(b []byte) bool {
		defer func() { seq++ }()
		if seq <= after {
			return true
		}
		_, err := a.w.Write(b)
		return err == nil
	}
	if !send(responses.QueuedEvent(responses.Base(op.ID, created, responses.Queued, op.Echo))) {
		return
	}
	_ = rc.Flush()
	for cursor := uint64(0); ; {
		evs, end, wait, err := src.Next(cursor)
		switch {
		case err != nil || end == streams.BrokeOff:
			if send(responses.LostEvent(seq)) {
				_ = rc.Flush()
			}
			return
		case end == streams.Whole:
			return
		}
		for _, e := range evs {
			if e.Seq <= cursor {
				continue
			}
			cursor = e.Seq
			if out, _, ok := responses.Event(e.Data, seq, op.ID, created); ok && !send(out) {
				return
			}
		}
		if len(evs) > 0 {
			if rc.Flush() != nil {
				return
			}
			continue
		}
		select {
		case <-wait:
		case <-a.r.Context().Done():
			return
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

package module

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/opview"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
)

// opStream is the event stream of an operation's answer (a streams.Broadcast), for GET
// {operations}/{id}/result with Accept: text/event-stream (docs/streams.md): live while an
// attempt receives it, or rebuilt from the stored result once the operation is final.
type opStream = streams.Broadcast

// newOpStream is an operation's stream copied nowhere.
func newOpStream() *opStream { return streams.NewBroadcast(nil) }

// maxResultWaiters bounds the followers of operations' results that wait in this process for
// an answer to begin: each holds a connection. The others are answered at once, as before the
// wait (409 OPERATION_NOT_FINISHED).
const maxResultWaiters = 256

// resultWaiters counts the followers waiting in this process for an operation's answer to
// begin.
var resultWaiters atomic.Int64

// awaitAnswer waits, for a follower asking for Server-Sent Events, until operation op's answer
// begins as a stream (here or, on shared storage, on another replica), the operation ends,
// deadline passes or the client leaves (docs/streams.md), as a keyed stream's duplicate waits
// for its original. It returns the operation as it then is, nil when the client left, and
// whether its answer is there to look at: false when the wait gave up (the deadline, the bound
// on waiters, the store failing). In this process it wakes on the runner's signals; the store
// is polled with backoff, for another replica's runner and for the final status written after
// an attempt.
func (h *Handler) awaitAnswer(q *opsRequest, op *store.Operation, deadline time.Time) (_ *store.Operation, look bool) {
	if resultWaiters.Add(1) > maxResultWaiters {
		resultWaiters.Add(-1)
		return op, false
	}
	defer resultWaiters.Add(-1)
	interval := pollInterval
	for {
		changed, begun := q.run.AwaitStream(op.ID)
		if op.Status.Final() || q.run.StreamOf(op.ID) != nil {
			return op, true
		}
		if _, ok := q.run.CurrentRecording(op); ok {
			return op, true
		}
		wait := min(interval, h.clock.Until(deadline))
		if wait <= 0 {
			return op, false
		}
		if !waitSignal(q, h.clock, wait, changed, begun) {
			return nil, false
		}
		interval = min(2*interval, streamPollMax)
		cur, err := q.st.GetOperation(op.ID)
		if err != nil {
			return op, false
		}
		op = cur.As(h.now())
	}
}

// waitSignal waits until a signal, d, or the client leaving; false for the last.
func waitSignal(q *opsRequest, clock clockwork.Clock, d time.Duration, signals ...<-chan struct{}) bool {
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-signals[0]:
	case <-signals[1]:
	case <-t.Chan():
	case <-q.r.Context().Done():
		return false
	}
	return true
}

// storedProgress is the progress of operation op's stream as recorded in a shared store, or
// nil.
func storedProgress(run *runner.Runner, op *store.Operation) *opview.Progress {
	events, bytes, ok := run.StoredProgress(op)
	if !ok {
		return nil
	}
	return &opview.Progress{Events: events, Bytes: bytes}
}

// progressOf is the progress of a stream under way here.
func progressOf(s *opStream) *opview.Progress {
	events, bytes := s.Progress()
	return &opview.Progress{Events: events, Bytes: bytes}
}

// followResult serves an operation's answer as Server-Sent Events: the events so far, then the
// live ones while it runs (from this replica's runner, or from the store when another replica
// runs it); Last-Event-ID or ?starting_after= resumes after that event. It reports false when
// there is no event stream to serve (the caller answers as usual).
func (h *Handler) followResult(q *opsRequest, op *store.Operation) bool {
	var (
		src    streams.Source
		status int
		header http.Header
	)
	switch {
	case !op.Status.Final():
		if s := q.run.StreamOf(op.ID); s != nil {
			src = s
			status, header = s.Head()
		} else if f, page := q.run.FollowStored(op); f != nil {
			src, status, header = f, page.Status, page.Header
		} else {
			return false
		}
	default:
		res, err := q.st.LoadResult(op.ID)
		if err != nil || res == nil {
			return false
		}
		s := newOpStream()
		if !s.Open(res.Status, res.Header) {
			return false
		}
		s.Write(res.Body)
		s.Finish(streams.Whole)
		src = s
		status, header = s.Head()
	}
	after := uint64(0)
	id := q.r.Header.Get(headerLastEventID)
	if id == "" {
		id = q.r.URL.Query().Get("starting_after")
	}
	if id != "" {
		after, _ = src.Find(id)
	}
	capture.SetRecordedHeader(q.w.Header(), header)
	q.w.Header().Del("Content-Length")
	q.w.WriteHeader(status)
	if streams.Relay(q.w, q.r, src, after) {
		panic(http.ErrAbortHandler) // see streams.Relay
	}
	return true
}

package module

import (
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/store"
)

// maxResultWaiters bounds the followers of operations' results that wait in this process for
// an answer to begin: each holds a connection. The others are answered at once, as before the
// wait (409 OPERATION_NOT_FINISHED).
const maxResultWaiters = 256

// resultWaiters counts the followers waiting in this process for an operation's answer to
// begin.
var resultWaiters atomic.Int64

// awaitAnswer waits, for a follower asking for Server-Sent Events, until operation op's answer
// begins as a stream (here or, on shared storage, on another replica), the operation ends,
// streamWaitMax passes or the client leaves (docs/streams.md), as a keyed stream's duplicate
// waits for its original. It returns the operation as it then is, or nil when the client left.
// In this process it wakes on the runner's signals; the store is polled with backoff, for
// another replica's runner and for the final status written after an attempt.
func (h *Handler) awaitAnswer(q *opsRequest, op *store.Operation) *store.Operation {
	if resultWaiters.Add(1) > maxResultWaiters {
		resultWaiters.Add(-1)
		return op
	}
	defer resultWaiters.Add(-1)
	deadline := h.now().Add(streamWaitMax)
	interval := pollInterval
	for {
		changed, begun := q.run.awaitStream(op.ID)
		if op.Status.Final() || q.run.streamOf(op.ID) != nil {
			return op
		}
		if _, ok := q.run.currentRecording(op); ok {
			return op
		}
		wait := min(interval, h.clock.Until(deadline))
		if wait <= 0 {
			return op
		}
		if !waitSignal(q, h.clock, wait, changed, begun) {
			return nil
		}
		interval = min(2*interval, streamPollMax)
		cur, err := q.st.GetOperation(op.ID)
		if err != nil {
			return op
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

// awaitStream returns channels closed when an attempt of operation id starts or ends on this
// runner (changed), and when the answer of the attempt running now begins (begun); nil when
// there is nothing to wait for here.
func (r *runner) awaitStream(id string) (changed, begun <-chan struct{}) {
	if r == nil {
		return nil, nil
	}
	return r.streams.await(id)
}

// await returns the channels of awaitStream.
func (o *opStreams) await(id string) (changed, begun <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.changed == nil {
		o.changed = make(chan struct{})
	}
	if s := o.m[id]; s != nil {
		begun = s.Begun()
	}
	return o.changed, begun
}

// signal wakes the waiters of await; the caller holds o.mu.
func (o *opStreams) signal() {
	if o.changed != nil {
		close(o.changed)
		o.changed = nil
	}
}

// settled wakes the waiters of await when an operation's outcome is written: a follower that
// found the attempt's stream ended and the operation still running reads it final at once.
func (o *opStreams) settled() {
	o.mu.Lock()
	o.signal()
	o.mu.Unlock()
}

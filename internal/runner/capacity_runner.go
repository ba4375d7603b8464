package runner

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/internal/tracing"
	"github.com/mulligan-gw/mulligan/store"
)

// How the runner works with capacity (docs/capacity.md, "Waiting is not running"): the
// operation at the durable queue's head (in the store's capacity order) stands in its pool's
// order while it is still queued; once it is granted a seat, the runner claims it, so an
// operation waiting for a seat stays queued and its started_at is when its call starts. One
// stand-in waits per runner at a time, so the queue's head meets the live sync calls in one
// order. Every attempt holds a seat; an operation past its queue deadline fails QUEUE_TIMEOUT
// without an upstream call.

// poolFor returns the seats op's block sends it through; nil without capacity.
func (r *Runner) poolFor(op *store.Operation) *capacity.Seats {
	return r.seats.PoolFor(r.execOf(op).Prefix)
}

// standInRefresh is how long the queue's head waits for a seat before the runner looks at the
// queue again: a more urgent operation may have come, or another replica claimed the head.
const standInRefresh = 250 * time.Millisecond

// standInTries bounds the looks of one claim that find the head gone when they claim it.
const standInTries = 8

// claimQueued claims the next queued operation. With capacity it first takes a seat of the
// pool of the queue's head in the head's place, then claims the head by id, and returns the
// seat with it; nil when nothing could be claimed now (the claim loop looks again on its next
// wake-up).
func (r *Runner) claimQueued(takeover time.Duration) (*store.Operation, *capacity.Seat, error) {
	if len(r.seats.Pools()) == 0 {
		op, err := r.st.ClaimNext(r.worker, takeover)
		return op, nil, err
	}
	if op, held, ok, err := r.claimWithFreeSeat(takeover); ok || err != nil {
		return op, held, err
	}
	var held *capacity.Seat
	began := r.clock.Now()
	for tries := 0; tries < standInTries && r.Alive(); {
		head, err := r.st.NextQueued()
		if err != nil || head == nil {
			held.GiveBack()
			return nil, nil, err
		}
		pool := r.poolFor(head)
		if held != nil && (pool == nil || !held.Of(pool)) {
			held.GiveBack()
			held = nil
		}
		if pool != nil && held == nil {
			if held, err = standIn(pool, head); err != nil {
				return nil, nil, err
			}
			if held == nil {
				continue // no seat yet: look at the head again
			}
			r.hooks.SeatWaited(r.clock.Since(began))
		}
		op, err := r.st.ClaimQueued(head.ID, r.worker, takeover)
		if err != nil || op != nil {
			if op == nil {
				held.GiveBack()
				held = nil
			}
			return op, held, err
		}
		// Claimed elsewhere, canceled or stale meanwhile: the next head may use the seat, whose
		// time is then not the key's it stood in for.
		tries++
		held.Detach()
	}
	held.GiveBack()
	return nil, nil, nil
}

// claimWithFreeSeat is the claim of a storage with one capacity block, without `shared`, while
// one of its seats is free and nothing waits for it: the seat is taken, then the queue's head
// claimed in one step, with no look at the queue first. ok is false when the claim must go the
// long way (several blocks, shared seats, no seat free, or the head is another block's).
func (r *Runner) claimWithFreeSeat(takeover time.Duration) (op *store.Operation, held *capacity.Seat, ok bool, err error) {
	pools := r.seats.Pools()
	if len(pools) != 1 || pools[0].Shares() {
		return nil, nil, false, nil
	}
	p := pools[0]
	start, free := p.TryTake()
	if !free {
		return nil, nil, false, nil
	}
	s := p.Seated(nil, start)
	if op, err = r.st.ClaimNext(r.worker, takeover); err != nil || op == nil {
		s.GiveBackUnwanted()
		return nil, nil, true, err
	}
	if r.poolFor(op) != p {
		s.GiveBack() // the head is another block's: its first attempt waits for its own seat
		return op, nil, true, nil
	}
	return op, s, true, nil
}

// standIn waits up to standInRefresh for a seat (and a shared one with `shared`) in the place of
// the queued operation head; nil when none came free meanwhile. A shared seat that cannot be
// counted is an error: the operation stays queued (shared seats fail closed).
func standIn(p *capacity.Seats, head *store.Operation) (*capacity.Seat, error) {
	deadline := p.Clock().Now().Add(standInRefresh)
	ask := operationAsk(head)
	w := p.Enqueue(ask)
	start, err := p.Await(context.Background(), w, standInRefresh)
	if err != nil {
		return nil, nil
	}
	s, err := p.WithShared(context.Background(), p.Seated(w, start), ask, deadline)
	switch {
	case errors.Is(err, capacity.ErrNoSeat):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return s, nil
}

func operationAsk(op *store.Operation) capacity.Ask {
	// Its stored urgency is the one it competes at across tenants: trusted.
	return capacity.Ask{Urgency: store.ClampUrgency(op.Urgency), Lift: op.Lift, Trusted: true, Scope: op.Scope, Key: op.FairKey,
		Weight: op.Weight, Since: op.SubmittedAt}
}

// takePending hands the execution of id the seat it was claimed with, once.
func (r *Runner) takePending(id string) *capacity.Seat {
	r.mu.Lock()
	defer r.mu.Unlock()
	ex := r.running[id]
	if ex == nil {
		return nil
	}
	p := ex.seat
	ex.seat = nil
	return p
}

// seatedAttempt runs one attempt holding a seat of op's pool: the first, the seat op was
// claimed with; a retry waits for one. When no attempt ran, halt is where op goes instead:
// failed QUEUE_TIMEOUT past its deadline, or back to the queue when the shared seats could not
// be counted (storage trouble is not the upstream's failure, so it costs no attempt).
func (r *Runner) seatedAttempt(ctx context.Context, op *store.Operation, req *store.Request, limit int64, first bool) (res Result, halt *store.Change) {
	pending := r.takePending(op.ID)
	pool := r.poolFor(op)
	if pool == nil || pending != nil && !pending.Of(pool) {
		pending.GiveBack() // a reload took the block's capacity away, or moved it
		pending = nil
	}
	if pool == nil {
		return r.attempt(ctx, op, req, limit), nil
	}
	req = r.seats.Upstream(op, req)
	s := pending
	if s == nil {
		var wait time.Duration
		if first && !op.QueueDeadline.IsZero() {
			if wait = r.clock.Until(op.QueueDeadline); wait <= 0 {
				timedOut := queueTimedOut()
				return Result{}, &timedOut
			}
		}
		var err error
		s, err = pool.Acquire(ctx, operationAsk(op), wait)
		switch {
		case errors.Is(err, capacity.ErrNoSeat):
			timedOut := queueTimedOut()
			return Result{}, &timedOut
		case err != nil && ctx.Err() == nil:
			r.log.Warn("taking a shared seat; the operation goes back to the queue", tracing.OperationFields(op, zap.Error(err))...)
			return Result{}, &store.Change{To: store.StatusQueued}
		case err != nil:
			return Result{}, nil // the execution ended while it waited: outcome says how
		}
	} else {
		s.Begin(r.clock.Now()) // the claim's write is not the call's latency
	}
	// A shared seat that can no longer be renewed cuts the attempt, as an upstream cut would:
	// another replica may take the seat (docs/capacity.md).
	actx, stop := s.Watch(ctx)
	res = r.attempt(actx, op, req, limit)
	stop()
	if errors.Is(context.Cause(actx), capacity.ErrSeatLapsed) && ctx.Err() == nil {
		r.log.Warn("the attempt's shared seat could not be renewed; the attempt was cut", tracing.OperationFields(op)...)
	}
	s.Release(capacity.AnswerSample(res.Status, res.Header, res.Body, ctx.Err()))
	return res, nil
}

// expiredInQueue fails a just-claimed operation whose queue deadline has passed, before it
// reaches the upstream; it reports whether it did.
func (r *Runner) expiredInQueue(op *store.Operation) bool {
	if op.QueueDeadline.IsZero() || r.clock.Now().Before(op.QueueDeadline) {
		return false
	}
	r.queueTimeout(op)
	r.finish(context.Background(), op.ID, queueTimedOut(), r.log.With(tracing.OperationFields(op)...))
	return true
}

// queueTimeout counts an operation failed QUEUE_TIMEOUT.
func (r *Runner) queueTimeout(op *store.Operation) {
	r.hooks.QueueTimedOut()
	if p := r.poolFor(op); p != nil {
		p.CountQueueTimeout()
	}
}

// staleEvery paces the look for queued operations past their deadline.
const staleEvery = time.Second

// dropStale fails queued operations past their queue deadline, so that they fail at their
// deadline even while nothing is claimed, and never reach the upstream.
func (r *Runner) dropStale() {
	ops, err := r.st.StaleQueued(r.clock.Now(), 100)
	if err != nil {
		r.log.Warn("looking for stale queued operations", zap.Error(err))
		return
	}
	for _, op := range ops {
		change := queueTimedOut()
		final, err := r.st.Transition(op.ID, change)
		if err != nil {
			continue // claimed, canceled or dropped meanwhile
		}
		r.countMoved(op, -1)
		r.queueTimeout(op)
		r.hooks.Settled(final)
		r.courier.Kick()
		r.log.Info("operation transition", tracing.OperationFields(final, zap.String("old_status", string(store.StatusQueued)),
			zap.String("new_status", string(final.Status)), zap.String("error_code", string(apierr.CodeQueueTimeout)))...)
	}
}

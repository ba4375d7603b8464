package module

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/store"
)

// How the runner works with capacity (docs/capacity.md): it claims from the durable queue (in
// the store's capacity order) only while one of the storage's seat pools has room, keeping at
// most one claimed operation waiting per pool, so the queue's head stands in the same order
// as the live sync calls; every attempt then holds a seat, and an operation past its queue
// deadline fails QUEUE_TIMEOUT without an upstream call.

// pendingSeat is the place a claimed operation took in its pool's order at claim time.
type pendingSeat struct {
	pool *seatPool
	w    *seatWaiter
}

// lookupSeatPool returns the seats of key, nil when no block has them.
func lookupSeatPool(key string) *seatPool {
	var found *seatPool
	seatPools.Range(func(k, v any) bool {
		if k == key {
			found, _ = v.(*seatPool)
			return false
		}
		return true
	})
	return found
}

// seatPoolsOf lists the seat pools whose operations the storage at where holds.
func seatPoolsOf(where string) []*seatPool {
	var pools []*seatPool
	seatPools.Range(func(_, v any) bool {
		if p, ok := v.(*seatPool); ok && p.where == where {
			pools = append(pools, p)
		}
		return true
	})
	return pools
}

// kickRunners wakes the claim loops of the storage at where: a seat came free.
func kickRunners(where string) {
	openStorages.Range(func(_, v any) bool {
		if s, ok := v.(*storage); ok && s.set.where() == where {
			s.run.kick()
		}
		return true
	})
}

// poolFor returns the seats op's block sends it through; nil without capacity.
func (r *runner) poolFor(op *store.Operation) *seatPool {
	return lookupSeatPool(seatPoolKey(r.where, execOf(op).Prefix))
}

// roomForQueued reports whether claiming one more operation is worth it: the storage has no
// capacity block, or one of its pools has room.
func (r *runner) roomForQueued() bool {
	pools := seatPoolsOf(r.where)
	for _, p := range pools {
		if p.roomForQueued() {
			return true
		}
	}
	return len(pools) == 0
}

// enqueueSeat puts a just-claimed operation in its pool's order; nil without capacity.
func (r *runner) enqueueSeat(op *store.Operation) *pendingSeat {
	p := r.poolFor(op)
	if p == nil {
		return nil
	}
	return &pendingSeat{pool: p, w: p.enqueue(operationAsk(op))}
}

func operationAsk(op *store.Operation) seatAsk {
	return seatAsk{Urgency: store.ClampUrgency(op.Urgency), Scope: op.Scope, Since: op.SubmittedAt, Queued: true}
}

// takePending hands the execution of id its place in the order, once.
func (r *runner) takePending(id string) *pendingSeat {
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

// seatedAttempt runs one attempt holding a seat of op's pool. The first attempt waits no
// later than the operation's queue deadline. When no attempt ran, halt is where op goes
// instead: failed QUEUE_TIMEOUT past its deadline, or back to the queue when the shared seats
// could not be counted (storage trouble is not the upstream's failure, so it costs no attempt).
func (r *runner) seatedAttempt(ctx context.Context, op *store.Operation, req *store.Request, limit int64, first bool) (res attemptResult, halt *store.Change) {
	pending := r.takePending(op.ID)
	pool := r.poolFor(op)
	if pool == nil {
		if pending != nil {
			pending.pool.abandon(pending.w)
		}
		return r.attempt(ctx, op, req, limit), nil
	}
	var wait time.Duration
	if first && !op.QueueDeadline.IsZero() {
		if wait = r.clock.Until(op.QueueDeadline); wait <= 0 {
			if pending != nil {
				pending.pool.abandon(pending.w)
			}
			timedOut := queueTimedOut()
			return attemptResult{}, &timedOut
		}
	}
	var w *seatWaiter
	if pending != nil && pending.pool == pool {
		w = pending.w
	} else {
		if pending != nil {
			pending.pool.abandon(pending.w)
		}
		w = pool.enqueue(operationAsk(op))
	}
	s, err := pool.awaitAll(ctx, w, wait)
	switch {
	case errors.Is(err, errNoSeat):
		timedOut := queueTimedOut()
		return attemptResult{}, &timedOut
	case err != nil && ctx.Err() == nil:
		r.log.Warn("taking a shared seat; the operation goes back to the queue", operationFields(op, zap.Error(err))...)
		return attemptResult{}, &store.Change{To: store.StatusQueued}
	case err != nil:
		return attemptResult{}, nil // the execution ended while it waited: outcome says how
	}
	// A shared seat that can no longer be renewed cuts the attempt, as an upstream cut would:
	// another replica may take the seat (docs/capacity.md).
	actx, stop := s.watch(ctx)
	res = r.attempt(actx, op, req, limit)
	stop()
	if seatLapsed(actx) && ctx.Err() == nil {
		r.log.Warn("the attempt's shared seat could not be renewed; the attempt was cut", operationFields(op)...)
	}
	s.release(attemptSample(res, ctx.Err()))
	return res, nil
}

// expiredInQueue fails a just-claimed operation whose queue deadline has passed, before it
// reaches the upstream; it reports whether it did.
func (r *runner) expiredInQueue(op *store.Operation) bool {
	if op.QueueDeadline.IsZero() || r.clock.Now().Before(op.QueueDeadline) {
		return false
	}
	r.queueTimeout(op)
	r.finish(context.Background(), op.ID, queueTimedOut(), r.log.With(operationFields(op)...))
	return true
}

// queueTimeout counts an operation failed QUEUE_TIMEOUT.
func (r *runner) queueTimeout(op *store.Operation) {
	capacityMetrics.queueTimeouts.Inc()
	if p := r.poolFor(op); p != nil {
		p.countQueueTimeout()
	}
}

// staleEvery paces the look for queued operations past their deadline.
const staleEvery = time.Second

// dropStale fails queued operations past their queue deadline, so that they fail at their
// deadline even while nothing is claimed, and never reach the upstream.
func (r *runner) dropStale() {
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
		countFinal(final)
		r.courier.Kick()
		r.log.Info("operation transition", operationFields(final, zap.String("old_status", string(store.StatusQueued)),
			zap.String("new_status", string(final.Status)), zap.String("error_code", string(apierr.CodeQueueTimeout)))...)
	}
}

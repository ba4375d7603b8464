package runner

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/tracing"
	"github.com/mulligan-gw/mulligan/store"
)

// takeOverBatch bounds the operations one round of takeovers settles (one transaction each):
// a backlog left by a dead replica is worked off over several rounds, each also bounded in time
// by takeoverEvery.
const takeOverBatch = 25

// takeOverLoop looks for operations whose worker fell silent, at once (a restarted Badger
// storage's dead process) and then every takeoverEvery, and recounts the queue. It has a goroutine of its own: on a slow database a round may take long, and the
// heartbeat must renew this replica's own leases meanwhile, or the others would take them over.
func (r *Runner) takeOverLoop() {
	defer r.beats.Done()
	if r.Alive() {
		r.takeOver()
	}
	for {
		t := r.clock.NewTimer(takeoverEvery(r.Settings().Takeover))
		select {
		case <-r.stopped:
			t.Stop()
			return
		case <-t.Chan():
		}
		if r.Alive() {
			r.takeOver()
			r.countQueued()
		}
	}
}

// takeoverEvery paces the look for operations whose replica fell silent.
func takeoverEvery(takeover time.Duration) time.Duration {
	return min(max(takeover/6, 250*time.Millisecond), 5*time.Second)
}

// takeOver resolves operations whose worker's lease ran out (its replica died, or lost storage
// for longer than a lease): asked to cancel -> canceled; else per the operation's on_crash,
// re-queued or failed with WORKER_LOST. The store applies each only while the lease is still
// expired and held by the same worker, so a takeover never races a renewal.
func (r *Runner) takeOver() {
	ops, err := r.st.ExpiredLeases(takeOverBatch)
	if err != nil {
		r.log.Warn("looking for expired leases", zap.Error(err))
		return
	}
	grace := r.takeoverGrace()
	budget := r.clock.Now().Add(takeoverEvery(r.Settings().Takeover))
	for _, op := range ops {
		if r.clock.Now().After(budget) {
			return // the rest in the next round
		}
		if r.replicated && r.clock.Now().Before(op.LeaseUntil.Add(grace)) {
			continue // its holder may be stopping still (see takeoverGrace)
		}
		// Badger's store is the judge: one process owns it, and it counts a lease as ended
		// when no worker of this process holds it (a restart voids the dead process's at once).
		r.resolveLost(op, store.Change{Holder: op.Holder, LeaseExpired: true}, "operation taken over")
	}
}

// resolveLost decides and applies the fate of an operation whose worker is gone: canceled,
// re-queued or failed. c carries the fence.
func (r *Runner) resolveLost(op *store.Operation, c store.Change, msg string) {
	c.To = store.StatusQueued
	switch {
	case !op.CancelRequestedAt.IsZero():
		c.To = store.StatusCanceled
	case r.execOf(op).OnCrash == crashFail:
		c.To, c.Error = store.StatusFailed, apierr.Failure(apierr.CodeWorkerLost, "The gateway stopped while this operation was running.")
	}
	final, err := r.st.Transition(op.ID, c)
	switch {
	case errors.Is(err, store.ErrNotHolder), errors.Is(err, store.ErrIllegalTransition), errors.Is(err, store.ErrNotFound):
		return // renewed, settled or taken over meanwhile
	case err != nil:
		r.log.Warn("settling an operation whose worker is gone", zap.String("operation_id", op.ID), zap.Error(err))
		return
	}
	if final.Status.Final() {
		r.hooks.Settled(final)
		r.courier.Kick()
	} else {
		r.countMoved(op, 1)
		r.Kick()
	}
	r.log.Info(msg, tracing.OperationFields(op, zap.String("old_holder", op.Holder),
		zap.String("old_status", string(op.Status)), zap.String("new_status", string(c.To)))...)
}

// crashFail is on_crash's value failing an operation whose worker is gone (docs/caddyfile.md).
const crashFail = "fail"

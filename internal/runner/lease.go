package runner

import (
	"time"

	"go.uber.org/zap"
)

// An operation must never run on two replicas at once (docs/backends.md). Its holder renews its
// lease every renewEvery; when renewals stop getting through (the database slow or unreachable,
// a renewal hanging for its whole timeout), the holder stops the execution on its own clock
// leaseMargin before the lease ends, without waiting for the database to answer. Another
// replica takes the operation over only takeoverGrace after the lease ended. Between the
// holder's stop and the takeover lie both: room for clocks that disagree a little (NTP keeps
// them well within it) and for the cancel to close the upstream connection.

// LeaseMargin is how long before its lease ends an execution stops when no renewal got through:
// a tenth of the lease, at most 2 s. Renewals come at least three times a lease (renewEvery), so
// a healthy execution is never stopped.
func LeaseMargin(takeover time.Duration) time.Duration {
	return min(takeover/10, 2*time.Second)
}

// takeoverGrace is how long past a lease's end a replica waits before taking the operation over
// from its silent holder. A Badger storage has one process: its leases end with it (a restart
// voids them at once), so there is no other holder to wait for.
func (r *Runner) takeoverGrace() time.Duration {
	if !r.replicated {
		return 0
	}
	return LeaseMargin(r.Settings().Takeover)
}

// armExpiry (re)sets ex's timer to stop it leaseMargin before ex.leaseUntil; r.mu is held.
func (r *Runner) armExpiry(id string, ex *execution, takeover time.Duration) {
	wait := r.clock.Until(ex.leaseUntil.Add(-LeaseMargin(takeover)))
	if ex.expiry != nil {
		ex.expiry.Reset(wait)
		return
	}
	ex.expiry = r.clock.AfterFunc(wait, func() {
		r.log.Warn("stopping an operation whose lease could not be renewed", zap.String("operation_id", id))
		ex.cancel(errLeaseLost)
	})
}

// RenewEvery paces the heartbeat: well under takeover, and at most a second apart so a
// cancel asked through another replica stops the call within 2 s (docs/api.md).
func RenewEvery(takeover time.Duration) time.Duration {
	return max(min(time.Second, takeover/3), 50*time.Millisecond)
}

// heartbeat renews the leases of what this runner executes and stops what was canceled or
// lost. Takeovers run in their own goroutine (takeOverLoop): however slow they are, renewals
// keep their pace.
func (r *Runner) heartbeat() {
	defer r.beats.Done()
	var lastStale time.Time
	for {
		takeover := r.Settings().Takeover
		t := r.clock.NewTimer(RenewEvery(takeover))
		select {
		case <-r.stopped:
			t.Stop()
			return
		case <-t.Chan():
		case <-r.renewNow:
			t.Stop()
		}
		r.renew(takeover)
		if r.clock.Since(lastStale) >= staleEvery && r.Alive() {
			lastStale = r.clock.Now()
			r.dropStale()
		}
	}
}

// renew extends the leases of every execution here. When storage cannot be reached for
// longer than a lease lasts, the executions are stopped: another worker may take them over
// once storage is back, and two must never run one operation.
func (r *Runner) renew(takeover time.Duration) {
	r.mu.Lock()
	ids := make([]string, 0, len(r.running))
	for id := range r.running {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	asked := r.clock.Now()
	ren, err := r.st.RenewLeases(r.worker, ids, takeover)
	if err != nil {
		// Each execution's expiry timer stops it before its lease ends, whether or not this
		// call ever returns.
		r.log.Warn("renewing leases", zap.Int("operations", len(ids)), zap.Error(err))
		return
	}
	lost := map[string]bool{}
	for _, id := range ren.Lost {
		lost[id] = true
		// An execution writing its outcome reads as lost once the write is in (the operation is
		// final, or back in the queue): no call of its is cut, and nothing is amiss. One that
		// really lost the operation while writing learns it from its fenced write.
		if r.stopLost(id) {
			r.log.Warn("operation no longer held by this worker", zap.String("operation_id", id))
		}
	}
	for _, id := range ren.CancelRequested {
		r.stopExecution(id, errCanceledByUser)
	}
	r.mu.Lock()
	for _, id := range ids {
		if ex := r.running[id]; ex != nil && !lost[id] {
			ex.leaseUntil = asked.Add(takeover)
			r.armExpiry(id, ex, takeover)
		}
	}
	r.mu.Unlock()
}

// stopLost stops execution id, whose operation the store no longer counts as held by this
// worker; it reports whether the execution was still at its upstream work (not settling).
func (r *Runner) stopLost(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ex, ok := r.running[id]
	if !ok {
		return false
	}
	ex.cancel(errLeaseLost)
	return !ex.settling
}

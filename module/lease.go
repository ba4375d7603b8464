package module

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

// leaseMargin is how long before its lease ends an execution stops when no renewal got through:
// a tenth of the lease, at most 2 s. Renewals come at least three times a lease (renewEvery), so
// a healthy execution is never stopped.
func leaseMargin(takeover time.Duration) time.Duration {
	return min(takeover/10, 2*time.Second)
}

// takeoverGrace is how long past a lease's end a replica waits before taking the operation over
// from its silent holder. A Badger storage has one process: its leases end with it (a restart
// voids them at once), so there is no other holder to wait for.
func (r *runner) takeoverGrace() time.Duration {
	if !r.replicated {
		return 0
	}
	return leaseMargin(r.config().takeover)
}

// armExpiry (re)sets ex's timer to stop it leaseMargin before ex.leaseUntil; r.mu is held.
func (r *runner) armExpiry(id string, ex *execution, takeover time.Duration) {
	wait := time.Until(ex.leaseUntil.Add(-leaseMargin(takeover)))
	if ex.expiry != nil {
		ex.expiry.Reset(wait)
		return
	}
	ex.expiry = time.AfterFunc(wait, func() {
		r.log.Warn("stopping an operation whose lease could not be renewed", zap.String("operation_id", id))
		ex.cancel(errLeaseLost)
	})
}

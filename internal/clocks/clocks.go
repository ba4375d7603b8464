// Package clocks holds what the gateway's services share about time (docs/development.md,
// "Time in tests"): the real clock, and contexts whose deadlines any clockwork.Clock keeps.
// Standard library and clockwork only.
package clocks

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"
)

// Real is the clock of the services in production; tests hand them a clockwork.FakeClock,
// which also serves as their storage's clock (badger.Options.Now), so leases, retries and polls
// move together when a test advances it.
var Real = clockwork.NewRealClock()

// WithTimeout is context.WithTimeout on clock: the standard library's on the real clock; on any
// other, a context canceled with cause context.DeadlineExceeded once clock passes the deadline.
// Either way context.Cause tells a timeout apart. clockwork.WithTimeout will not do: its Err
// blocks until the context is done, and the proxy asks Err of a live request.
func WithTimeout(parent context.Context, clock clockwork.Clock, d time.Duration) (context.Context, context.CancelFunc) {
	if clock == Real {
		return context.WithTimeout(parent, d)
	}
	ctx, cancel := context.WithCancelCause(parent)
	t := clock.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return deadlineContext{ctx, clock.Now().Add(d)}, func() { t.Stop(); cancel(nil) }
}

// WithDeadline is WithTimeout until at.
func WithDeadline(parent context.Context, clock clockwork.Clock, at time.Time) (context.Context, context.CancelFunc) {
	if clock == Real {
		return context.WithDeadline(parent, at)
	}
	return WithTimeout(parent, clock, clock.Until(at))
}

// deadlineContext reports a deadline on a fake clock, as a backoff reads it.
type deadlineContext struct {
	context.Context
	deadline time.Time
}

func (c deadlineContext) Deadline() (time.Time, bool) { return c.deadline, true }

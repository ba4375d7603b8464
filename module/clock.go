package module

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/internal/clocks"
)

// realClock is the clock of the services in production (internal/clocks).
var realClock = clocks.Real

func withTimeout(parent context.Context, clock clockwork.Clock, d time.Duration) (context.Context, context.CancelFunc) {
	return clocks.WithTimeout(parent, clock, d)
}

func withDeadline(parent context.Context, clock clockwork.Clock, at time.Time) (context.Context, context.CancelFunc) {
	return clocks.WithDeadline(parent, clock, at)
}

package module

import (
	"context"
	"time"
)

// detachedContext keeps parent's values (Caddy's replacer, vars, logger) but not its
// cancellation: an upstream call paid for by a keyed request runs on after the client leaves,
// for at most limit.
func detachedContext(parent context.Context, limit time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(parent), limit)
}

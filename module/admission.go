package module

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// slots is a counting semaphore that never waits.
type slots chan struct{}

func (s slots) tryAcquire() bool {
	select {
	case s <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s slots) release() { <-s }

// byteBudget bounds the request bodies buffered at once by one handler (max_buffered): past it
// a request is refused with 503 GATEWAY_BUSY instead of the process running out of memory.
type byteBudget struct {
	limit int64
	used  atomic.Int64
}

// take reserves n bytes, or reports false when that would pass the limit.
func (b *byteBudget) take(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *byteBudget) give(n int64) { b.used.Add(-n) }

// rateLimitedRetry is the Retry-After of 429 RATE_LIMITED: about the time an operation takes to
// leave the queue.
const rateLimitedRetry = 5 * time.Second

// admission applies async max_per_scope: a scope's queued and running operations, as the
// storage counts them (so after a restart, and across replicas on PostgreSQL), plus the ones this
// block is accepting at this moment, which the storage does not count yet.
type admission struct {
	limit   int
	mu      sync.Mutex
	pending map[string]int // scope hash -> requests between their check and their store write
}

func newAdmission(limit int) *admission {
	if limit <= 0 {
		return nil
	}
	return &admission{limit: limit, pending: map[string]int{}}
}

// enter reports whether scope may add an operation. When it may, the request counts as pending
// until the returned leave is called, once the operation is stored or given up.
func (a *admission) enter(st store.Queue, scope string) (leave func(), ok bool, err error) {
	n, err := st.ActiveCount(scope)
	if err != nil {
		return nil, false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if n+a.pending[scope] >= a.limit {
		return nil, false, nil
	}
	a.pending[scope]++
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.pending[scope]--; a.pending[scope] == 0 {
			delete(a.pending, scope)
		}
	}, true, nil
}

// rateLimitedError is the 429 a scope over max_per_scope gets.
func rateLimitedError(limit int) apiError {
	return apiError{Code: CodeRateLimited, RetryAfter: rateLimitedRetry, Details: map[string]any{"max_per_scope": limit},
		Message: fmt.Sprintf("This caller already has %d operations queued or running; retry when one finishes.", limit)}
}

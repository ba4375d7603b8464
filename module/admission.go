package module

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mulligan-gw/mulligan/internal/apierr"
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

// admission applies async max_per_scope. The storage counts a scope's queued and running
// operations and refuses one over the limit in the same step as it stores it, serialised per
// scope across replicas (store.Operation.ScopeLimit). What only this replica knows is added to
// that count: the calls running within their `after` window that may still become operations
// (pending), which the storage does not hold yet.
type admission struct {
	limit   int
	mu      sync.Mutex
	pending map[string]int // scope hash -> calls between their check and their store write
}

func newAdmission(limit int) *admission {
	if limit <= 0 {
		return nil
	}
	return &admission{limit: limit, pending: map[string]int{}}
}

// room is the ScopeLimit of an operation of scope accepted now: the limit less this replica's
// pending calls of the scope. Zero or less: the scope is full.
func (a *admission) room(scope string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.limit - a.pending[scope]
}

// enter reports whether a call of scope that may become an operation may start. It counts as
// pending from before the storage is read (so two calls checking at once see each other) until
// the returned leave is called, once its operation is stored or the call is answered.
func (a *admission) enter(st store.Queue, scope string) (leave func(), ok bool, err error) {
	a.mu.Lock()
	a.pending[scope]++
	a.mu.Unlock()
	leave = func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.pending[scope]--; a.pending[scope] == 0 {
			delete(a.pending, scope)
		}
	}
	n, err := st.ActiveCount(scope)
	if err != nil || n+a.pendingOf(scope) > a.limit {
		leave()
		return nil, false, err
	}
	return leave, true, nil
}

func (a *admission) pendingOf(scope string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pending[scope]
}

// rateLimitedError is the 429 a scope over max_per_scope gets.
func rateLimitedError(limit int) apierr.Error {
	return apierr.Error{Code: apierr.CodeRateLimited, RetryAfter: rateLimitedRetry, Details: map[string]any{"max_per_scope": limit},
		Message: fmt.Sprintf("This caller already has %d operations queued or running; retry when one finishes.", limit)}
}

package webhook

import (
	"errors"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"
)

// breakers holds one circuit breaker per endpoint name, created on first use.
type breakers struct {
	failures uint32
	cooldown time.Duration

	mu     sync.Mutex
	byName map[string]*gobreaker.CircuitBreaker[Outcome]
}

func newBreakers(failures uint32, cooldown time.Duration) breakers {
	return breakers{failures: failures, cooldown: cooldown, byName: map[string]*gobreaker.CircuitBreaker[Outcome]{}}
}

// get returns name's breaker: it opens after `failures` consecutive failed
// Deliver calls, stays open for `cooldown`, then lets exactly one probe
// through (half-open); the probe's success closes it, its failure reopens it.
func (b *breakers) get(name string) *gobreaker.CircuitBreaker[Outcome] {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cb, ok := b.byName[name]; ok {
		return cb
	}
	failures := b.failures
	cb := gobreaker.NewCircuitBreaker[Outcome](gobreaker.Settings{
		Name:        name,
		MaxRequests: 1,
		Timeout:     b.cooldown,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
		IsExcluded:  func(err error) bool { return errors.Is(err, errCallerGone) },
	})
	b.byName[name] = cb
	return cb
}

// BreakerState returns the circuit breaker state of the named endpoint:
// "closed", "half-open" or "open". An endpoint not delivered to yet is
// "closed".
func (d *Deliverer) BreakerState(endpointName string) string {
	d.breakers.mu.Lock()
	cb, ok := d.breakers.byName[endpointName]
	d.breakers.mu.Unlock()
	if !ok {
		return gobreaker.StateClosed.String()
	}
	return cb.State().String()
}

// breakerFailure tells the breaker whether a Deliver call shows the endpoint
// unhealthy: only RetryLater does (transport error, timeout, 3xx, 408, 429,
// 5xx). Delivered, Disabled (410) and DeadLetter mean the endpoint answered,
// so they count as successes; an outcome cut short by the caller is
// excluded from the counts.
func breakerFailure(o Outcome) error {
	if o.Result == RetryLater {
		return o.Err
	}
	return nil
}

package module

import (
	"math"
	"time"
)

// adaptiveLimit is `limit auto`: a gradient limit in the manner of Netflix's concurrency-limits
// Gradient2 and Envoy's adaptive concurrency filter (docs/capacity.md). It compares the latency
// of calls now with the upstream's floor (its latency with no queue): while they match it grows
// by about the square root of the limit; as a queue forms inside the model server the latency
// rises and the limit falls towards floor/latency of itself. A 429 or 503 answer or a timeout
// cuts it multiplicatively (AIMD's decrease).
type adaptiveLimit struct {
	min, max float64
	limit    float64
	short    float64 // recent latency, seconds (exponentially weighted)
	floor    rttFloor
}

// Tuning of the adaptive limit (docs/capacity.md).
const (
	adaptSmoothing = 0.2 // weight of a new estimate in the limit
	adaptShortEWMA = 0.3 // weight of a new sample in the recent latency
	adaptBackoff   = 0.9 // the cut on an overloaded answer
	// adaptTolerance is how much slower than the floor calls may get before the limit shrinks:
	// a little, so that output-length noise does not read as a queue.
	adaptTolerance = 1.1
)

func newAdaptiveLimit(lo, hi int) *adaptiveLimit {
	a := &adaptiveLimit{}
	a.bound(lo, hi)
	a.limit = a.min
	return a
}

// bound sets the range, moving the limit into it.
func (a *adaptiveLimit) bound(lo, hi int) {
	a.min, a.max = float64(lo), float64(hi)
	a.limit = min(max(a.limit, a.min), a.max)
}

func (a *adaptiveLimit) current() int { return int(a.limit) }

// update takes one finished call (its latency, whether the upstream was overloaded, and how
// many calls were in flight with it) and returns the new limit.
func (a *adaptiveLimit) update(rtt time.Duration, overloaded bool, inFlight int) int {
	if overloaded {
		a.limit = max(a.min, a.limit*adaptBackoff)
		return a.current()
	}
	secs := max(rtt.Seconds(), 1e-6)
	a.floor.add(secs)
	if a.short == 0 {
		a.short = secs
	} else {
		a.short += adaptShortEWMA * (secs - a.short)
	}
	gradient := min(max(adaptTolerance*a.floor.value()/a.short, 0.5), 1)
	next := a.limit*gradient + math.Sqrt(a.limit)
	if float64(inFlight) < a.limit/2 && next > a.limit {
		return a.current() // too little traffic to learn that more seats would help
	}
	a.limit = min(max(a.limit*(1-adaptSmoothing)+next*adaptSmoothing, a.min), a.max)
	return a.current()
}

// rttFloor is the lowest latency of the recent past: the minimum over two windows of
// floorWindow samples, so the floor follows the upstream when it gets slower for good (a bigger
// model, longer prompts) instead of holding its best moment forever.
type rttFloor struct {
	cur, prev float64
	n         int
}

const floorWindow = 200

func (f *rttFloor) add(s float64) {
	if f.n%floorWindow == 0 {
		f.prev, f.cur = f.cur, s
	}
	f.cur = min(f.cur, s)
	f.n++
}

func (f *rttFloor) value() float64 {
	if f.prev == 0 {
		return f.cur
	}
	return min(f.cur, f.prev)
}

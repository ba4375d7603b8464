package capacity

import (
	"math"
	"time"
)

// Adaptive is `limit auto`: a gradient limit in the manner of Netflix's concurrency-limits
// Gradient2 and Envoy's adaptive concurrency filter (docs/capacity.md). It compares the latency
// of calls now with the upstream's floor (its latency with no queue): while they match it grows
// by a little queue allowance; as a queue forms inside the model server the latency rises and
// the limit falls towards floor/latency of itself. A 429 or 503 answer or a timeout cuts it
// multiplicatively (AIMD's decrease).
//
// The floor is measured as Envoy measures its minRTT: every probeEvery calls the limit drops to
// its minimum for a few calls, so the model server's own queue drains and the calls that follow
// show its latency without a queue. Kept from calls under load instead, the floor would climb
// with the very queue it is meant to detect.
type Adaptive struct {
	min, max float64
	limit    float64
	short    float64 // recent latency, seconds (exponentially weighted)
	floor    float64 // latency without a queue, seconds; 0 until measured
	calls    int
	probe    probe
}

// probe is a floor measurement under way.
type probe struct {
	left  int     // samples still to take; 0: not probing
	low   float64 // the lowest so far
	saved float64 // the limit to return to
}

// Tuning of the adaptive limit (docs/capacity.md).
const (
	adaptSmoothing = 0.2 // weight of a new estimate in the limit
	adaptShortEWMA = 0.3 // weight of a new sample in the recent latency
	adaptBackoff   = 0.9 // the cut on an overloaded answer
	// adaptTolerance is how much slower than the floor calls may get before the limit shrinks:
	// a little, so that output-length noise does not read as a queue.
	adaptTolerance = 1.1
	probeEvery     = 500 // calls between floor measurements
	probeSamples   = 5   // calls a floor measurement takes
)

func NewAdaptive(lo, hi int) *Adaptive {
	a := &Adaptive{}
	a.Bound(lo, hi)
	a.limit = a.min
	return a
}

// Bound sets the range, moving the limit into it.
func (a *Adaptive) Bound(lo, hi int) {
	a.min, a.max = float64(lo), float64(hi)
	a.limit = min(max(a.limit, a.min), a.max)
}

func (a *Adaptive) Current() int { return int(a.limit) }

// Update takes one finished call (its latency, whether the upstream was overloaded, and how
// many calls were in flight with it) and returns the new limit.
func (a *Adaptive) Update(rtt time.Duration, overloaded bool, inFlight int) int {
	secs := max(rtt.Seconds(), 1e-6)
	if a.probing(secs, inFlight) {
		return a.Current()
	}
	if overloaded {
		a.limit = max(a.min, a.limit*adaptBackoff)
		return a.Current()
	}
	if a.floor == 0 || secs < a.floor {
		a.floor = secs
	}
	if a.short == 0 {
		a.short = secs
	} else {
		a.short += adaptShortEWMA * (secs - a.short)
	}
	gradient := min(max(adaptTolerance*a.floor/a.short, 0.5), 1)
	next := a.limit*gradient + max(1, math.Sqrt(a.limit)/2)
	if float64(inFlight) < a.limit/2 && next > a.limit {
		return a.Current() // too little traffic to learn that more seats would help
	}
	a.limit = min(max(a.limit*(1-adaptSmoothing)+next*adaptSmoothing, a.min), a.max)
	return a.Current()
}

// probing runs the floor measurement: it starts one every probeEvery calls and reports whether
// this call belonged to one.
func (a *Adaptive) probing(secs float64, inFlight int) bool {
	a.calls++
	if a.probe.left == 0 {
		if a.calls%probeEvery != 0 || a.limit <= a.min {
			return false
		}
		a.probe = probe{left: probeSamples, low: math.Inf(1), saved: a.limit}
		a.limit = a.min
		return true
	}
	if float64(inFlight) <= a.min { // a call that ran with the queue drained
		a.probe.low = min(a.probe.low, secs)
		a.probe.left--
	}
	if a.probe.left == 0 {
		a.floor, a.short, a.limit = a.probe.low, a.probe.low, a.probe.saved
	}
	return true
}

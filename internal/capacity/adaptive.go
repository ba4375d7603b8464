package capacity

import (
	"math"
	"math/bits"
	"slices"
	"time"
)

// Adaptive is `limit auto`, in the manner of Netflix's concurrency-limits Gradient2 and Envoy's
// adaptive concurrency filter (docs/capacity.md): it estimates how many calls wait inside the
// model server's own queue and steers the limit so that a small allowance of them do, which
// keeps every slot busy and the server's queue short. A 429 or 503 answer or a timeout cuts it
// multiplicatively (AIMD's decrease).
//
// The estimate is Little's law: of the calls in flight, the share that waits in the server's
// queue is the time they spend waiting over the time they take (both exponentially weighted).
// A call's wait is its signal less the signal's floor (its value with no queue), the signal
// chosen per answer so that the length of a generation does not read as a queue: the time to
// the first byte of an event stream (the wait for a slot plus the prefill, whatever the length
// of what follows); else the latency over the answer's usage.completion_tokens, times those
// tokens; else the whole latency. Each kind keeps its own floor, and the time per token one for
// each length of answer (tokenKind: a short answer's is mostly prefill). Only 2xx answers are samples:
// a 4xx, a 500 or a cut call says nothing about the queue. A sample below its floor (a cached
// or tiny answer, too fast to have waited) waited nothing: it never lowers the floor, and one
// far below it (tooFast) is no sample at all; a floor is measured leaving out the samples far
// faster than the others (floorOf).
//
// The floor is measured as Envoy measures its minRTT: every probeEvery samples the limit drops
// to its minimum for a few calls, so the model server's own queue drains and the calls that
// follow show the signal without a queue; the floor is their median, so one stray fast answer
// cannot set it (a length of answer that the probe saw fewer than minLengthSamples answers of
// is scaled with the others instead: measureLengths). Kept from calls under load instead, the floor would climb with the very queue
// it is meant to detect.
type Adaptive struct {
	min, max float64
	limit    float64
	floors   [kindCount]floor
	wait     float64 // recent wait in the server's queue, seconds (exponentially weighted)
	took     float64 // recent latency, seconds (exponentially weighted)
	samples  int
	fast     int // samples far faster than their floor in a row (tooFast), none other between
	probe    probe
}

// signalKind is which latency signal an answer gave.
type signalKind int

const (
	kindFirstEvent signalKind = iota // time to the first byte of an event stream
	kindLatency                      // the whole latency
	// kindPerToken is the latency per output token (usage.completion_tokens) of an answer of one
	// token; kindPerToken+b of an answer of 2^b to 2^(b+1)-1 tokens (tokenKind). Each length
	// has its floor: a short answer's time is mostly its prefill, which a long generation's
	// time per token leaves out.
	kindPerToken
	kindCount = kindPerToken + tokenLengths
)

// tokenLengths is how many lengths of answers, by powers of two of their tokens, keep a floor
// per token each: 1, 2-3, 4-7, ... and the last, 4096 tokens and more. Within one length the
// prefill's share of the time per token varies less than twofold for one prompt length; the
// prompt's own length still moves the prefill (docs/capacity.md, "Not there yet").
const tokenLengths = 13

// minLengthSamples is how many of a probe's answers of one length re-measure its floor: fewer
// (a probe's seven spread over several lengths) leave the floor as it was, so that one answer a
// little fast or slow does not set it.
const minLengthSamples = 3

// tokenKind is the signal of an answer of n output tokens (n > 0).
func tokenKind(n int) signalKind {
	return kindPerToken + signalKind(min(bits.Len(uint(n))-1, tokenLengths-1))
}

// floor is one kind's signal without a queue, in seconds (per token from kindPerToken on).
type floor struct {
	value float64   // 0 until measured
	boot  []float64 // the first samples, until there are enough to set value
}

// probe is a floor measurement under way.
type probe struct {
	left  int         // samples still to take; 0: not probing
	got   [][]float64 // per kind (signalKind), the samples taken with the queue drained
	saved float64     // the limit to return to
}

// Tuning of the adaptive limit (docs/capacity.md).
const (
	adaptSmoothing = 0.2 // weight of a new estimate in the limit
	adaptShortEWMA = 0.1 // weight of a new sample in the recent wait and latency
	adaptBackoff   = 0.9 // the cut on an overloaded answer
	probeEvery     = 500 // samples between floor measurements
	probeSamples   = 7   // calls a floor measurement takes
)

// Sample is how one call that held a seat went, as the limit reads it.
type Sample struct {
	Latency    time.Duration // from the seat's call start to the end of its answer
	FirstByte  time.Duration // to the first byte of the answer's body; 0: not known
	Stream     bool          // the answer is an event stream
	Tokens     int           // the answer's usage.completion_tokens; 0: not known
	Status     int           // the answer's status; 0: none
	Overloaded bool          // a 429 or 503 answer, or no answer before the deadline
	InFlight   int           // calls in flight with it, itself included
}

// kind picks the sample's signal and its value in seconds; false: the answer says nothing
// about the model server's queue.
func (s Sample) kind() (signalKind, float64, bool) {
	if s.Status < 200 || s.Status > 299 {
		return 0, 0, false
	}
	switch {
	case s.Stream && s.FirstByte > 0:
		return kindFirstEvent, max(s.FirstByte.Seconds(), 1e-6), true
	case s.Tokens > 0:
		return tokenKind(s.Tokens), max(s.Latency.Seconds(), 1e-6) / float64(s.Tokens), true
	}
	return kindLatency, max(s.Latency.Seconds(), 1e-6), true
}

// waited is how long the call waited in the server's queue by its signal v over the floor.
func (s Sample) waited(kind signalKind, v, floor float64) float64 {
	w := max(v-floor, 0)
	if kind >= kindPerToken {
		w *= float64(s.Tokens)
	}
	return min(w, max(s.Latency.Seconds(), 1e-6))
}

// NewAdaptive returns a limit between lo and hi, starting at lo.
func NewAdaptive(lo, hi int) *Adaptive {
	a := &Adaptive{}
	a.Bound(lo, hi)
	a.limit = a.min
	return a
}

// Bound sets the range, moving the limit into it, and the limit a floor probe under way goes
// back to when it ends: a reload (or `shared N` raising the minimum) during a probe would else
// see the probe end on a limit outside the new range.
func (a *Adaptive) Bound(lo, hi int) {
	a.min, a.max = float64(lo), float64(hi)
	a.limit = min(max(a.limit, a.min), a.max)
	if a.probe.left > 0 {
		a.probe.saved = min(max(a.probe.saved, a.min), a.max)
	}
}

// Current is the limit now.
func (a *Adaptive) Current() int { return int(a.limit) }

// Update takes one finished call and returns the new limit.
func (a *Adaptive) Update(s Sample) int {
	if s.Overloaded {
		if a.probe.left == 0 {
			a.limit = max(a.min, a.limit*adaptBackoff)
		} else {
			a.probe.saved = max(a.min, a.probe.saved*adaptBackoff)
		}
		return a.Current()
	}
	kind, v, ok := s.kind()
	if !ok {
		return a.Current()
	}
	f := &a.floors[kind]
	if a.probe.left == 0 && v < f.value/tooFast {
		// Far faster than its floor (a cached answer, a model list): a call unlike those the
		// floor measures, which tells nothing of the queue, nor counts towards the next probe.
		// Counted as a wait of nothing, each was one more step of the limit, down after a queue
		// showed: fifty took it from 34 to 3. But probeEvery of them in a row, and no other
		// sample, say the floor is no longer these calls' (measured on calls far slower, a
		// prompt much longer, none of which come any more): a probe measures it again. Else
		// the limit never moved again, neither up nor down, whatever the queue.
		if a.fast++; a.fast >= probeEvery {
			a.startProbe()
		}
		return a.Current()
	}
	a.fast = 0
	if a.probing(kind, v, s.InFlight) {
		return a.Current()
	}
	if f.value == 0 {
		// Not measured yet: the first calls of a kind set its floor, as a probe would.
		if f.boot = append(f.boot, v); len(f.boot) < probeSamples {
			return a.Current()
		}
		f.value, f.boot = floorOf(f.boot), nil
	}
	took := max(s.Latency.Seconds(), 1e-6)
	if a.took == 0 {
		a.wait, a.took = s.waited(kind, v, f.value), took
	} else {
		a.wait += adaptShortEWMA * (s.waited(kind, v, f.value) - a.wait)
		a.took += adaptShortEWMA * (took - a.took)
	}
	queued := float64(s.InFlight) * min(a.wait/a.took, 1) // Little's law
	next := a.limit - queued + max(1, math.Sqrt(a.limit)/2)
	if float64(s.InFlight) < a.limit/2 && next > a.limit {
		return a.Current() // too little traffic to learn that more seats would help
	}
	a.limit = min(max(a.limit*(1-adaptSmoothing)+next*adaptSmoothing, a.min), a.max)
	return a.Current()
}

// startProbe begins a floor measurement: the limit at its minimum for probeSamples calls.
func (a *Adaptive) startProbe() {
	a.probe = probe{left: probeSamples, got: make([][]float64, kindCount), saved: a.limit}
	a.limit, a.fast = a.min, 0
}

// probing runs the floor measurement: it starts one every probeEvery samples and reports
// whether this sample belonged to one.
func (a *Adaptive) probing(kind signalKind, v float64, inFlight int) bool {
	a.samples++
	if a.probe.left == 0 {
		if a.samples%probeEvery != 0 {
			return false
		}
		a.startProbe()
		return true
	}
	if float64(inFlight) <= a.min { // a call that ran with the queue drained
		a.probe.got[kind] = append(a.probe.got[kind], v)
		a.probe.left--
	}
	if a.probe.left == 0 {
		for k, got := range a.probe.got[:kindPerToken] {
			if len(got) > 0 {
				a.floors[k].value = floorOf(got)
			}
		}
		a.measureLengths()
		a.limit, a.wait, a.took = a.probe.saved, 0, 0
	}
	return true
}

// measureLengths sets the floors per token of the lengths of answer from a probe's answers with
// usage. Seven answers spread over several lengths, one each: a length's floor set by one
// answer 10 % fast or slow read every answer of that length after as waiting or not, and an
// unqueued limit of 64 fell under 32 for 6-9 % of the answers of noisy generations. So a length
// with minLengthSamples answers in the probe is measured by them (floorOf); the others that have
// a floor are scaled by the median of every answer's ratio to its length's floor, so that a
// model server grown slower or faster moves the floors of lengths seldom seen too; a length
// without a floor yet takes its answers' (measured with no queue, unlike a first boot).
func (a *Adaptive) measureLengths() {
	lengths := a.probe.got[kindPerToken:]
	var ratios []float64
	for i, got := range lengths {
		if f := a.floors[kindPerToken+signalKind(i)].value; f > 0 {
			for _, v := range got {
				ratios = append(ratios, v/f)
			}
		}
	}
	scale := 1.0
	if len(ratios) >= minLengthSamples {
		scale = median(ratios)
	}
	for i, got := range lengths {
		f := &a.floors[kindPerToken+signalKind(i)]
		switch {
		case len(got) >= minLengthSamples:
			f.value = floorOf(got)
		case f.value > 0:
			f.value *= scale
		case len(got) > 0:
			f.value = floorOf(got)
		}
	}
}

// tooFast is how much faster than the calls a floor measures a sample is too fast to be one of
// them (a cached answer, a model list, a health check): it is left out of the floor, and it is
// no sample of the queue. Lengths of the calls a floor compares vary less than that: a whole
// latency of the flood's mixed calls, 1 to 15 times the shortest; a time per token, less than
// twice.
const tooFast = 20

// floorOf is the floor measured by xs (not empty), samples of one kind with the model server's
// queue drained: their median, leaving out those tooFast times faster than their upper
// quartile. Half of the answers instant put the median among them, and every call after read
// as waiting its whole latency: the limit stayed at its minimum (a quarter of a 4-slot server's
// capacity). Measured against the slowest sample instead, one slow call (a first generation of
// 5 s before calls of 100 ms) became the floor, and the limit grew to its maximum. xs is
// reordered.
func floorOf(xs []float64) float64 {
	slices.Sort(xs)
	upper := xs[len(xs)*3/4]
	i, _ := slices.BinarySearch(xs, upper/tooFast)
	return median(xs[i:])
}

// median of xs (not empty); xs is reordered.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

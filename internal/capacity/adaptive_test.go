package capacity

import (
	"testing"
	"time"
)

// slottedUpstream models a model server with slots and a first-come queue behind them: a call
// takes base while it holds a slot, and waits its turn behind the calls queued before it.
func slottedLatency(base time.Duration, slots, inFlight int) time.Duration {
	if inFlight <= slots {
		return base
	}
	return base * time.Duration(inFlight) / time.Duration(slots)
}

func TestAdaptiveLimitFindsTheUpstreamSlotsWithoutStarvingIt(t *testing.T) {
	a := NewAdaptive(1, 64)
	const slots = 4
	// Saturating load: the gateway always has work waiting, so the limit is always in use.
	var sum, n, busy int
	for i := range 3000 {
		limit := a.Current()
		a.Update(slottedLatency(100*time.Millisecond, slots, limit), false, limit)
		if i >= 1000 {
			sum += limit
			n++
			if limit >= slots {
				busy++
			}
		}
	}
	mean := float64(sum) / float64(n)
	// A queue inside the server shorter than its slots on average, and every slot busy (the
	// limit at least the slots) at least 90 % of the time: the floor probes cost the rest.
	if mean < slots || mean > 2*slots || float64(busy) < 0.9*float64(n) {
		t.Fatalf("the limit averaged %.1f and filled the slots %d of %d calls; want %d..%d and 90 %%", mean, busy, n, slots, 2*slots)
	}
	t.Logf("limit averaged %.2f for %d slots; slots full for %.1f %% of calls", mean, slots, 100*float64(busy)/float64(n))
}

func TestAdaptiveLimitCutsOnOverloadAndStaysInItsBounds(t *testing.T) {
	a := NewAdaptive(2, 10)
	for range 200 {
		a.Update(50*time.Millisecond, false, a.Current())
	}
	if a.Current() != 10 {
		t.Fatalf("with latency at its floor the limit grew to %d; want the max 10", a.Current())
	}
	before := a.Current()
	a.Update(time.Second, true, before)
	if a.Current() >= before {
		t.Fatalf("a 503 left the limit at %d", a.Current())
	}
	for range 100 {
		a.Update(time.Second, true, a.Current())
	}
	if a.Current() != 2 {
		t.Fatalf("after many overloads the limit is %d; want the min 2", a.Current())
	}
}

func TestAdaptiveLimitDoesNotGrowWithoutTraffic(t *testing.T) {
	a := NewAdaptive(1, 64)
	for range 50 {
		a.Update(10*time.Millisecond, false, 1)
	}
	grown := a.Current()
	for range 200 {
		a.Update(10*time.Millisecond, false, 1) // one call at a time: nothing says more seats help
	}
	if a.Current() > max(grown, 2) {
		t.Fatalf("one call at a time grew the limit from %d to %d", grown, a.Current())
	}
}

package capacity

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// Under `shared N`, an adaptive limit goes no lower than N. An upstream's limit is grown to 12
// on a fast model server without shared seats; `shared 4` is then configured (as a reload
// does), and every answer overloaded cuts the limit to the 4 shared seats, not below, so a call
// that wins one of the fleet's seats does not wait for a local one while the model server's
// slot idles; the model server's metrics, saturated, stop there too. A reload without `shared`
// gives the operator's minimum back. A fixed limit is the operator's, and an adaptive limit's
// Max still bounds the floor.
func TestAnAdaptiveLimitGoesNoLowerThanTheSharedSeats(t *testing.T) {
	clock := clockwork.NewFakeClock()
	auto := Config{Auto: true, Min: 1, Max: 64}
	call := func(u *Upstream, s Sample) {
		seat, err := u.Acquire(context.Background(), Ask{Scope: "a", Since: clock.Now()}, 0)
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(s.Latency)
		seat.Release(s)
	}
	overload := func(u *Upstream) int {
		for range 40 {
			call(u, Sample{Latency: time.Second, Status: 503, Overloaded: true, InFlight: 1})
		}
		return u.Snapshot().Limit
	}
	u := NewUpstream(auto, UpstreamOptions{Seats: SeatsOptions{Clock: clock}})
	u.Configure(auto, nil, 0)
	for i := 0; u.Snapshot().Limit < 12; i++ { // rounds of calls filling every seat, each at the floor
		if i == 100 {
			t.Fatalf("the limit grew to %d in 100 rounds of calls on a fast server; want 12", u.Snapshot().Limit)
		}
		var seats []*Seat
		for range u.Snapshot().Limit {
			seat, err := u.Acquire(context.Background(), Ask{Scope: "a", Since: clock.Now()}, 0)
			if err != nil {
				t.Fatal(err)
			}
			seats = append(seats, seat)
		}
		clock.Advance(100 * time.Millisecond)
		for _, seat := range seats {
			seat.Release(Sample{Latency: 100 * time.Millisecond, Status: 200})
		}
	}
	u.Configure(auto, nil, 4) // the storage is not there (FindShared nil): the local pool alone is under test
	if got := overload(u); got != 4 {
		t.Fatalf("under shared 4 the limit fell to %d under overload; want 4", got)
	}
	for range 10 {
		u.Follow(ServerState{Waiting: 100}, Saturation{MaxWaiting: 5}, clock.Now().Add(time.Second))
	}
	if got := u.Snapshot().Limit; got != 4 {
		t.Fatalf("under shared 4 the model server's saturated metrics cut the limit to %d; want 4", got)
	}
	u.Configure(auto, nil, 0)
	if got := overload(u); got != 1 {
		t.Fatalf("without shared the limit fell to %d under overload; want the minimum, 1", got)
	}
	for _, c := range []struct {
		name string
		cfg  Config
		want int
	}{
		{"limit auto 1 2, shared 4", Config{Auto: true, Min: 1, Max: 2}, 2},
		{"limit 2, shared 4", Config{Limit: 2}, 2},
	} {
		u := NewUpstream(c.cfg, UpstreamOptions{Seats: SeatsOptions{Clock: clock}})
		u.Configure(c.cfg, nil, 4)
		if got := overload(u); got != c.want {
			t.Errorf("%s: the limit fell to %d under overload; want %d", c.name, got, c.want)
		}
	}
}

// A floor probe under way when the range is raised (a reload, or `shared N` raising the
// minimum) ends on a limit within the new range: it went back to the limit it saved, below the
// new minimum.
func TestAFloorProbeEndsWithinARangeRaisedMeanwhile(t *testing.T) {
	a := NewAdaptive(1, 64)
	a.limit, a.samples = 3, probeEvery-1
	ok := Sample{Latency: 100 * time.Millisecond, Status: 200, InFlight: 1}
	a.Update(ok) // starts a probe, saving 3
	if a.probe.left == 0 {
		t.Fatal("no floor probe started")
	}
	a.Bound(8, 64)
	for i := 0; a.probe.left > 0; i++ {
		if i == 100 {
			t.Fatal("the probe did not end")
		}
		a.Update(ok)
	}
	if got := a.Current(); got != 8 {
		t.Fatalf("the probe ended on a limit of %d; want the new minimum, 8", got)
	}
}

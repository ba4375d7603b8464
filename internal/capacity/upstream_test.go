package capacity

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// Under `shared N`, an adaptive limit goes no lower than N: every answer overloaded, the local
// limit stays at the 4 shared seats (at 1 without them), so a call that wins one of the fleet's
// seats never waits for a local one while the model server's slot idles. A fixed limit is the
// operator's, and an adaptive limit's Max still bounds it.
func TestAnAdaptiveLimitGoesNoLowerThanTheSharedSeats(t *testing.T) {
	clock := clockwork.NewFakeClock()
	overload := func(u *Upstream) int {
		for range 20 {
			s, err := u.Acquire(context.Background(), Ask{Scope: "a", Since: clock.Now()}, 0)
			if err != nil {
				t.Fatal(err)
			}
			clock.Advance(time.Second)
			s.Release(Sample{Latency: time.Second, Status: 503, Overloaded: true, InFlight: 1})
		}
		return u.Snapshot().Limit
	}
	auto := Config{Auto: true, Min: 1, Max: 64}
	for _, c := range []struct {
		name   string
		cfg    Config
		shared int
		want   int
	}{
		{"limit auto 1 64, shared 4", auto, 4, 4},
		{"limit auto 1 64", auto, 0, 1},
		{"limit auto 1 2, shared 4", Config{Auto: true, Min: 1, Max: 2}, 4, 2},
		{"limit 2, shared 4", Config{Limit: 2}, 4, 2},
	} {
		u := NewUpstream(c.cfg, UpstreamOptions{Seats: SeatsOptions{Clock: clock}})
		// The shared seats' storage is not there (FindShared nil): the local pool alone is under test.
		u.Configure(c.cfg, nil, c.shared)
		if got := overload(u); got != c.want {
			t.Errorf("%s: the limit fell to %d under overload; want %d", c.name, got, c.want)
		}
	}
}

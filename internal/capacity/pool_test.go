package capacity

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/store"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// granted reports whether w holds a seat, without waiting.
func granted(w *Waiter) bool {
	select {
	case <-w.ready:
		return true
	default:
		return false
	}
}

// order fills a one-seat pool with asks behind a held seat and returns the scopes (with their
// index) in the order the seats go to them, one release at a time.
func order(t *testing.T, clock *clockwork.FakeClock, asks []Ask) []int {
	t.Helper()
	p := NewPool(clock, Config{Limit: 1})
	holder := p.Enqueue(Ask{Scope: "holder", Since: clock.Now()})
	if !granted(holder) {
		t.Fatal("the first ask of an empty pool waits")
	}
	ws := make([]*Waiter, len(asks))
	for i, a := range asks {
		ws[i] = p.Enqueue(a)
	}
	var got []int
	for range asks {
		p.Release(clock.Now(), Sample{Status: 200})
		for i, w := range ws {
			if granted(w) && !contains(got, i) {
				got = append(got, i)
			}
		}
	}
	return got
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPoolServesTheMostUrgentThenScopesInTurnThenTheOldest(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	asks := []Ask{
		{Urgency: 3, Scope: "a", Since: t0.Add(1)},
		{Urgency: 3, Scope: "a", Since: t0.Add(2)},
		{Urgency: 3, Scope: "b", Since: t0.Add(3)},
		{Urgency: 1, Scope: "c", Since: t0.Add(4)},
		{Urgency: 7, Scope: "d", Since: t0.Add(5)},
	}
	// c is the most urgent; then a and b alternate (a's oldest first), then a's second, then
	// the background work.
	if got, want := order(t, clock, asks), []int{3, 0, 2, 1, 4}; !equal(got, want) {
		t.Fatalf("seats went to %v; want %v", got, want)
	}
}

func TestPoolAgingRaisesBackgroundWorkUpToTheDefault(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0.Add(4 * store.AgingStep))
	asks := []Ask{
		{Urgency: 3, Scope: "fresh", Since: clock.Now()},
		{Urgency: 7, Scope: "old", Since: t0},                                  // four steps waited: effectively 3, and older
		{Urgency: 6, Scope: "young", Since: clock.Now().Add(-store.AgingStep)}, // one step: effectively 5
		{Urgency: 1, Scope: "urgent", Since: clock.Now()},
	}
	if got, want := order(t, clock, asks), []int{3, 1, 0, 2}; !equal(got, want) {
		t.Fatalf("seats went to %v; want %v", got, want)
	}
}

func TestPoolWaitEndsAtItsDeadlineOnTheClock(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	if _, err := p.Await(context.Background(), p.Enqueue(Ask{Scope: "a", Since: t0}), time.Second); err != nil {
		t.Fatal(err)
	}
	w := p.Enqueue(Ask{Scope: "b", Since: t0})
	done := make(chan error, 1)
	go func() {
		_, err := p.Await(context.Background(), w, 5*time.Second)
		done <- err
	}()
	if err := clock.BlockUntilContext(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(5 * time.Second)
	if err := <-done; !errors.Is(err, ErrNoSeat) {
		t.Fatalf("after its wait: %v; want ErrNoSeat", err)
	}
	if s := p.Snapshot(); s.InUse != 1 || s.Waiting != [8]int{} || p.Remembered() != 0 {
		t.Fatalf("after the wait ended: %+v, %d scopes remembered; want one seat in use and nobody waiting", s, p.Remembered())
	}
}

func TestPoolAbandonedGrantFreesItsSeatForTheNext(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	first := p.Enqueue(Ask{Scope: "a", Since: t0})
	second := p.Enqueue(Ask{Scope: "b", Since: t0})
	if !granted(first) || granted(second) {
		t.Fatal("want the first granted, the second waiting")
	}
	p.Abandon(first) // granted, never taken
	if !granted(second) {
		t.Fatal("the seat of an abandoned grant did not go to the next waiter")
	}
	if _, err := p.Await(context.Background(), second, time.Second); err != nil {
		t.Fatal(err)
	}
	p.Abandon(second) // taken: abandoning it changes nothing
	if s := p.Snapshot(); s.InUse != 1 {
		t.Fatalf("%d seats in use; want the taken one", s.InUse)
	}
}

func TestPoolConfigureKeepsSeatsInUseAndGrantsNewRoom(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	p.Enqueue(Ask{Scope: "a", Since: t0})
	w := p.Enqueue(Ask{Scope: "b", Since: t0})
	p.Configure(Config{Limit: 2})
	if !granted(w) {
		t.Fatal("a larger limit did not grant the waiter")
	}
	p.Configure(Config{Auto: true, Min: 1, Max: 8})
	if s := p.Snapshot(); !s.Auto || s.InUse != 2 || s.Limit != 1 {
		t.Fatalf("after switching to auto: %+v; want auto, 2 in use, limit at its min 1", s)
	}
}

package capacity

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

func TestSeatsTurnsHoldOnlyWaitingScopes(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewSeats(Config{Limit: 1}, SeatsOptions{Clock: clock})
	for i := range 100 { // a hundred callers, one call each
		s, err := p.Acquire(context.Background(), Ask{Scope: fmt.Sprint("tenant-", i), Since: clock.Now()}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		s.Release(Sample{})
	}
	held, _ := p.Acquire(context.Background(), Ask{Scope: "held", Since: clock.Now()}, time.Second)
	refused := make(chan error, 1)
	go func() {
		_, err := p.Acquire(context.Background(), Ask{Scope: "refused", Since: clock.Now()}, time.Millisecond)
		refused <- err
	}()
	if err := clock.BlockUntilContext(context.Background(), 1); err != nil { // its wait's timer
		t.Fatal(err)
	}
	clock.Advance(time.Millisecond)
	if err := <-refused; !errors.Is(err, ErrNoSeat) {
		t.Fatalf("with the one seat held: %v, want ErrNoSeat", err)
	}
	held.Release(Sample{})
	if n := p.Remembered(); n != 0 {
		t.Fatalf("%d scopes remembered with nobody waiting; want none", n)
	}
}

// A seat coming back, used or not, tells OnFree (queued work may take it); each wait for a
// local seat is measured on the clock, including the waits that got none.
func TestSeatsTellWhenASeatIsFreeAndHowLongEachWaitTook(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	freed := 0
	var waits []time.Duration
	p := NewSeats(Config{Limit: 1}, SeatsOptions{Clock: clock, OnFree: func() { freed++ },
		Waited: func(d time.Duration) { waits = append(waits, d) }})
	held, err := p.Acquire(context.Background(), Ask{Scope: "a", Since: clock.Now()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan error, 1)
	go func() {
		_, err := p.Acquire(context.Background(), Ask{Scope: "b", Since: clock.Now()}, 3*time.Second)
		refused <- err
	}()
	if err := clock.BlockUntilContext(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(3 * time.Second)
	if err := <-refused; !errors.Is(err, ErrNoSeat) {
		t.Fatalf("a wait of 3s with the seat held: %v, want ErrNoSeat", err)
	}
	held.Release(Sample{})
	held.Release(Sample{}) // once
	unused, err := p.Acquire(context.Background(), Ask{Scope: "c", Since: clock.Now()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	unused.GiveBack()
	if freed != 2 {
		t.Fatalf("OnFree told %d times for two seats back; want 2", freed)
	}
	if want := []time.Duration{0, 3 * time.Second, 0}; fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Fatalf("waits measured %v; want %v", waits, want)
	}
	if n := p.Snapshot().InUse; n != 0 {
		t.Fatalf("%d seats in use after all came back; want 0", n)
	}
}

// A seat detached from the waiter it was granted to (a stand-in whose operation another
// replica claimed, the seat going to the next head) charges that waiter's key the least a turn
// costs, and its call's time to no key.
func TestSeatsDetachedSeatChargesNoKeyItsCall(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewSeats(Config{Limit: 1}, SeatsOptions{Clock: clock})
	s, err := p.Acquire(context.Background(), Ask{Scope: "a", Since: clock.Now()}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	charged := p.known["a"].finish
	p.mu.Unlock()
	s.Detach()
	clock.Advance(time.Minute)
	s.Release(Sample{Status: 200})
	p.mu.Lock()
	defer p.mu.Unlock()
	if got, want := p.known["a"].finish, charged-defaultHold+minCharge; got != want {
		t.Fatalf("key a's turn ends at %v after a detached seat's minute-long call; want %v (charged %v, then the least a turn costs)", got, want, charged)
	}
	if p.known["a"].hold != 0 {
		t.Fatalf("key a learnt a hold of %v from a call that was not its own", p.known["a"].hold)
	}
}

package postgres

import (
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

// Replicas whose `shared N` differ (a reload rolling through the fleet): A (N=1) stands ahead
// in the line but cannot take a seat while one is held; B (N=3) sees a free seat and takes it.
func TestLineHoldsBackNoSeatForAReplicaThatCannotTakeIt(t *testing.T) {
	reps := replicas(t, 2, storetest.NewClock())
	a, b := reps[0], reps[1]
	for _, s := range []string{"h1", "h2"} {
		if ok, err := a.AcquireSeat("model", s, "holder", 3, time.Minute, store.SeatWaiter{Urgency: 3}); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	for range 60 { // a few seconds of looks by both
		if ok, err := a.AcquireSeat("model", "a", "A", 1, time.Minute, store.SeatWaiter{Urgency: 0, Waited: time.Second}); ok || err != nil {
			t.Fatal("A", ok, err)
		}
		ok, err := b.AcquireSeat("model", "b", "B", 3, time.Minute, store.SeatWaiter{Urgency: 3})
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("B never took the seat free by its limit: A, which cannot take it, stands ahead of it")
}

// A u=7 call that has waited an hour on one replica ranks as the default, and ahead of a new
// u=3 call of another: the fleet's line ages urgency (store.EffectiveUrgency) as the queue does.
func TestLineAgesUrgencyAsTheQueueDoes(t *testing.T) {
	reps := replicas(t, 2, storetest.NewClock())
	a, b := reps[0], reps[1]
	if ok, err := a.AcquireSeat("model", "h", "holder", 1, time.Minute, store.SeatWaiter{}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, _ := a.AcquireSeat("model", "a", "A", 1, time.Minute, store.SeatWaiter{Urgency: 7, Waited: time.Hour}); ok {
		t.Fatal("A took a held seat")
	}
	if ok, _ := b.AcquireSeat("model", "b0", "B", 1, time.Minute, store.SeatWaiter{Urgency: 3}); ok {
		t.Fatal("B took a held seat")
	}
	if err := a.ReleaseSeat("model", "h"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := b.AcquireSeat("model", "b1", "B", 1, time.Minute, store.SeatWaiter{Urgency: 3}); ok {
		t.Fatal("a fresh u=3 call went ahead of a u=7 call aged an hour (EffectiveUrgency 3, waited longer)")
	}
}

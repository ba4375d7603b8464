package postgres

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

// seatTenant is a key whose calls one replica keeps waiting for the shared seats of pool
// "model", always one in the fleet's line (a backlog), as many held at once as the line gives
// it: each call holds its seat for hold(n), n its calls before, then releases it.
type seatTenant struct {
	key    string
	weight float64
	hold   func(n int) time.Duration
	after  *seatTenant   // its calls begin to come once after's first call took a seat; nil: at once
	first  chan struct{} // closed once its first call took a seat
	once   sync.Once
	took   atomic.Int64 // calls that took a seat
	held   atomic.Int64 // seats held now
	slot   atomic.Int64 // slot time its calls held, nanoseconds, counted at release
}

// runSeatTenants runs tenants, one replica each, on limit shared seats for d, then lets go of
// every seat; it returns once all are back. watch, when not nil, runs meanwhile, from the start.
func runSeatTenants(t *testing.T, limit int, d time.Duration, watch func(), tenants ...*seatTenant) {
	t.Helper()
	reps := replicas(t, len(tenants), storetest.NewClock())
	ctx, stop := context.WithTimeout(context.Background(), d)
	defer stop()
	came := time.Now() // the backlog came at once: the line orders it by the keys' turns
	var calls sync.WaitGroup
	if watch != nil {
		calls.Go(watch)
	}
	for _, k := range tenants {
		k.first = make(chan struct{})
	}
	for i, k := range tenants {
		st, worker := reps[i], fmt.Sprintf("replica-%d", i)
		calls.Go(func() {
			if k.after != nil {
				select {
				case <-k.after.first:
				case <-ctx.Done():
					return
				}
			}
			for n := 0; ctx.Err() == nil; {
				seat := fmt.Sprintf("%s-%d", worker, n)
				ok, err := st.AcquireSeat("model", seat, worker, limit, time.Minute,
					store.SeatWaiter{Urgency: 3, Waited: time.Since(came), Key: k.key, Weight: k.weight})
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				k.took.Add(1)
				k.once.Do(func() { close(k.first) })
				k.held.Add(1)
				hold := k.hold(n)
				n++
				calls.Go(func() {
					began := time.Now()
					select {
					case <-time.After(hold):
					case <-ctx.Done():
					}
					k.slot.Add(int64(time.Since(began)))
					k.held.Add(-1)
					if err := st.ReleaseSeat("model", seat); err != nil {
						t.Error(err)
					}
				})
			}
		})
	}
	calls.Wait()
}

// The fleet's line shares the shared seats' slot time between keys, not turns: on one seat, a
// key of 300 ms calls and a key of 75 ms calls, both with a backlog, hold the seat about as long
// as each other. With a turn moved to the time of each take (schema 19), the keys took turns,
// and the long calls held it four times as long.
func TestSharedSeatsShareSlotTimeNotTurns(t *testing.T) {
	long := &seatTenant{key: "key:long", hold: func(int) time.Duration { return 300 * time.Millisecond }}
	short := &seatTenant{key: "key:short", hold: func(int) time.Duration { return 75 * time.Millisecond }}
	runSeatTenants(t, 1, 4*time.Second, nil, long, short)
	l, s := time.Duration(long.slot.Load()), time.Duration(short.slot.Load())
	t.Logf("slot time: long %v in %d calls, short %v in %d calls", l, long.took.Load(), s, short.took.Load())
	// The database counts a call's commits and round trips too, which the test does not: on a
	// loaded machine the short calls' key is charged more than it measures. 4 when keys take
	// turns.
	if ratio := float64(l) / float64(s); ratio > 2 || ratio < 1/2.0 {
		t.Fatalf("the long calls' key held the seat %.1f times as long as the short calls'; want about as long", ratio)
	}
}

// A key's weight is its share of the shared seats' slot time: of weight 3 against weight 1,
// with calls alike, it holds them about three times as long. The fleet's line ignored weights
// before.
func TestSharedSeatsShareSlotTimeByWeight(t *testing.T) {
	call := func(int) time.Duration { return 100 * time.Millisecond }
	heavy := &seatTenant{key: "key:heavy", weight: 3, hold: call}
	light := &seatTenant{key: "key:light", weight: 1, hold: call}
	runSeatTenants(t, 1, 4*time.Second, nil, heavy, light)
	h, l := time.Duration(heavy.slot.Load()), time.Duration(light.slot.Load())
	t.Logf("slot time: weight 3 %v, weight 1 %v", h, l)
	if ratio := float64(h) / float64(l); ratio < 2 || ratio > 4.5 {
		t.Fatalf("the weight-3 key held the seats %.1f times as long as the weight-1 key; want about 3", ratio)
	}
}

// A seat held past its charge counts in its key's turn while it is held: on four seats, a key
// whose calls turned from 100 ms to ones that do not end before the test does takes no more
// than three of them against a key of 100 ms calls, which goes on getting seats. Counted only
// at release, the long calls' key was charged 100 ms a seat, took turns with the other, and held
// all four within a second. The stuck key's calls come once the other's first took a seat, so
// that its endless calls never find the other key not yet in line.
func TestSharedSeatsCountASeatInItsTurnWhileItIsHeld(t *testing.T) {
	brisk := &seatTenant{key: "key:brisk", hold: func(int) time.Duration { return 100 * time.Millisecond }}
	stuck := &seatTenant{key: "key:stuck", after: brisk, hold: func(n int) time.Duration {
		if n == 0 {
			return 100 * time.Millisecond // measured as a key of short calls first
		}
		return time.Hour
	}}
	var atEnd, briskLate int64 // read once runSeatTenants has waited for watch
	watch := func() {
		time.Sleep(3 * time.Second)
		before := brisk.took.Load()
		time.Sleep(2 * time.Second)
		atEnd, briskLate = stuck.held.Load(), brisk.took.Load()-before
	}
	runSeatTenants(t, 4, 5500*time.Millisecond, watch, stuck, brisk)
	t.Logf("the stuck key held %d of 4 seats; the brisk key took %d seats in the last two seconds", atEnd, briskLate)
	if atEnd > 3 || briskLate < 5 {
		t.Fatalf("the stuck key held %d of 4 seats and the brisk key took %d in the last two seconds; want at most 3, and seats going on to the brisk key",
			atEnd, briskLate)
	}
}

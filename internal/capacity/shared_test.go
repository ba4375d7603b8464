package capacity

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// The shared seats are tested against a real PostgreSQL store (the one backend that has them).
// The replica's side runs on the test's clock: renewals come, polls look and calls are cut when
// the test advances it. The storage leases seats on the database's own clock, so a seat lapses
// in storage only as real time passes (short real leases where a test needs one to lapse).

// openSeats opens a PostgreSQL store on dsn reading leases on clock.
func openSeats(t testing.TB, dsn string, clock clockwork.Clock) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: dsn, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// newTestShared is pool "test"'s `shared 1` in st for worker "w", leased as the gateway leases
// an operation of takeover lease.
func newTestShared(st store.SharedSeats, clock clockwork.Clock, lease time.Duration) *Shared {
	return newReplicaShared(st, clock, lease, "w")
}

// newReplicaShared is newTestShared for the replica named worker.
func newReplicaShared(st store.SharedSeats, clock clockwork.Clock, lease time.Duration, worker string) *Shared {
	var n atomic.Int64
	// SlowLook is real time beside a fake clock's deadlines: long, so that a test's slow steps
	// under -race never read as a storage that hangs.
	return NewShared(st, SharedOptions{Name: "test", Worker: worker, Limit: 1, Lease: lease,
		Margin: min(lease/10, 2*time.Second), Renew: max(min(time.Second, lease/3), 50*time.Millisecond),
		Clock: clock, Log: zap.NewNop(), NewID: func(time.Time) string { return worker + "_seat_" + strconv.FormatInt(n.Add(1), 10) },
		SlowLook: time.Minute})
}

// sharedSeatsOf returns seats of cfg on clock that take shared seats from *shared, which the
// test may swap as a reload does.
func sharedSeatsOf(cfg Config, clock clockwork.Clock, shared *atomic.Pointer[Shared]) *Seats {
	return NewSeats(cfg, SeatsOptions{Clock: clock, Shared: shared.Load})
}

// heldByOther takes the one seat of pool "test" for another replica, for a minute.
func heldByOther(t *testing.T, st *postgres.Store) {
	t.Helper()
	if ok, err := st.AcquireSeat("test", "other", "w2", 1, time.Minute, store.SeatWaiter{}); err != nil || !ok {
		t.Fatalf("the other replica's seat: %v %v", ok, err)
	}
}

// pollUntil moves clock on by the poller's pace until cond holds: the poller looks again at
// each step, whatever it waits for.
func pollUntil(t *testing.T, clock *clockwork.FakeClock, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, what, func() bool {
		if cond() {
			return true
		}
		clock.Advance(sharedPoll)
		return false
	})
}

func TestSharedSeatTakenIsReleasedAfterAReloadDropsShared(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	st := openSeats(t, pgtest.Database(t), clock)
	var shared atomic.Pointer[Shared]
	shared.Store(newTestShared(st, clock, time.Minute))
	p := sharedSeatsOf(Config{Limit: 1}, clock, &shared)
	s, err := p.Acquire(context.Background(), Ask{Scope: "a", Since: clock.Now()}, 0)
	if err != nil || !s.Shared() {
		t.Fatalf("taking a seat with a shared one: %v %v", err, s)
	}
	shared.Store(nil) // a reload without `shared`
	s.Release(Sample{})
	if snap := p.Snapshot(); snap.InUse != 0 {
		t.Fatalf("%d local seats in use after the release; want 0", snap.InUse)
	}
	// The shared seat went back too: with shared 1, another holder takes it.
	if ok, err := st.AcquireSeat("test", "other", "w2", 1, time.Minute, store.SeatWaiter{}); err != nil || !ok {
		t.Fatalf("the shared seat after the release: %v %v; want it free", ok, err)
	}
}

// A shared seat that cannot be counted (the database is down) fails the call with the
// storage's error, holding no local seat: the shared seats fail closed. The local seat goes
// back to whoever waits for it, but queued work is not told of it: its claim would fail the
// same way at once, and again (the runner's claims ran back to back); its poll looks.
func TestSharedSeatStorageFailureFailsTheCallAndFreesItsLocalSeat(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	st := openSeats(t, pgtest.Database(t), clock)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	freed := make(chan struct{}, 1)
	var shared atomic.Pointer[Shared]
	shared.Store(newTestShared(st, clock, time.Minute))
	p := NewSeats(Config{Limit: 1}, SeatsOptions{Clock: clock, Shared: shared.Load, OnFree: func() { freed <- struct{}{} }})
	s, err := p.Acquire(context.Background(), Ask{Scope: "a", Since: clock.Now()}, time.Minute)
	if err == nil || errors.Is(err, ErrNoSeat) {
		t.Fatalf("a seat with the database down: %v %v; want the storage's error", s, err)
	}
	if n := p.Snapshot().InUse; n != 0 {
		t.Fatalf("%d local seats in use after the failure; want 0", n)
	}
	select {
	case <-freed:
		t.Fatal("the local seat went back telling OnFree: queued work would fail to take it at once, and again")
	default:
	}
}

// The replica's one look for a shared seat serves its waiters in the order they came: each
// seat that comes free goes to the longest waiting.
func TestSharedSeatGoesToTheLocalWaitersInTheOrderTheyCame(t *testing.T) {
	w := newSharedWaiters(t, 3)
	for i := range 3 {
		w.wait(strconv.Itoa(i), Ask{Scope: "a", Since: w.clock.Now()}, i+1)
	}
	w.servedInOrder("0", "1", "2")
}

// Keys take turns for shared seats as for local ones: a tenant whose three calls came first gets
// the first seat freed, then another tenant's call that came after them, then its own next ones
// (a key's turn moves on with each seat it gets). Before, the seats went in the order the calls
// came, and on three replicas a flooding tenant held an honest one's calls behind its backlog.
func TestSharedSeatKeysTakeTurns(t *testing.T) {
	w := newOwnTurnWaiters(t, 4)
	w.wait("honest0", Ask{Scope: "honest", Since: w.clock.Now()}, 1)
	w.servedInOrder("honest0") // a tenant served before (see TestSharedSeatFreshKeysShareOneTurn)
	heldByOther(t, w.st)
	for i := range 3 {
		w.wait("flood"+strconv.Itoa(i), Ask{Scope: "flood", Since: w.clock.Now()}, i+1)
	}
	w.wait("honest", Ask{Scope: "honest", Since: w.clock.Now()}, 4)
	w.servedInOrder("flood0", "honest", "flood1", "flood2")
}

// Keys that got no shared seat lately share one turn: a tenant minting a credential per call,
// its calls there first, gets one seat in two against a tenant served before, not all of them.
func TestSharedSeatFreshKeysShareOneTurn(t *testing.T) {
	w := newOwnTurnWaiters(t, 4)
	w.wait("honest0", Ask{Scope: "honest", Since: w.clock.Now()}, 1)
	w.servedInOrder("honest0")
	heldByOther(t, w.st)
	for i := range 3 {
		w.wait("minted"+strconv.Itoa(i), Ask{Scope: "minted-" + strconv.Itoa(i), Since: w.clock.Now()}, i+1)
	}
	w.wait("honest1", Ask{Scope: "honest", Since: w.clock.Now()}, 4)
	w.servedInOrder("minted0", "honest1", "minted1", "minted2")
}

// A call waiting for a shared seat holds no local seat an urgent call of its replica needs; the
// seat that comes free goes to the most urgent waiter; and the shared seats are visible: limit,
// held by this replica and by the fleet, waiting by urgency.
func TestSharedSeatWaitersHoldNoLocalSeatAndTheMostUrgentGoesFirst(t *testing.T) {
	w := newSharedWaiters(t, 1)
	w.wait("batch", Ask{Urgency: 7, Scope: "a", Since: w.clock.Now()}, 1)
	w.wait("urgent", Ask{Urgency: 0, Trusted: true, Scope: "b", Since: w.clock.Now()}, 2)
	ss := w.shared.Load().Snapshot()
	if ss.Limit != 1 || ss.Held != 0 || ss.Fleet == nil || *ss.Fleet != 1 || ss.Waiting[0] != 1 || ss.Waiting[7] != 1 {
		t.Fatalf("shared seats shown as %+v; want limit 1, none held here, 1 in the fleet, one waiter at u=0 and one at u=7", ss)
	}
	w.servedInOrder("urgent", "batch")
}

// sharedWaiters are calls of one replica waiting for a shared seat of a pool of one, held by
// another replica.
type sharedWaiters struct {
	t      *testing.T
	clock  *clockwork.FakeClock
	st     *postgres.Store
	shared atomic.Pointer[Shared]
	p      *Seats
	seats  chan namedSeat
}

// ownTurns is a PostgreSQL store whose replica keeps its own keys' turns for shared seats, for
// the tests of keys taking turns on the test clock. The fleet's turns (store.SeatTurns) are read
// as lengths of time on the database's clock, which a test clock that jumps does not keep:
// TestSharedSeatKeysTakeTurnsAcrossTheFleet tests them on the real clock.
type ownTurns struct {
	store.SharedSeats
	store.SeatNotices
	store.SeatHandover
}

// newOwnTurnWaiters is newSharedWaiters whose replica keeps its own keys' turns (ownTurns).
func newOwnTurnWaiters(t *testing.T, limit int) *sharedWaiters {
	w := newSharedWaiters(t, limit)
	w.shared.Store(newTestShared(ownTurns{w.st, w.st, w.st}, w.clock, time.Minute))
	return w
}

// namedSeat is the seat a waiter got.
type namedSeat struct {
	name string
	s    *Seat
}

// newSharedWaiters makes a replica with limit local seats whose one shared seat another holds.
func newSharedWaiters(t *testing.T, limit int) *sharedWaiters {
	w := &sharedWaiters{t: t, clock: clockwork.NewFakeClockAt(time.Now()), seats: make(chan namedSeat, 8)}
	w.st = openSeats(t, pgtest.Database(t), w.clock)
	heldByOther(t, w.st)
	w.shared.Store(newTestShared(w.st, w.clock, time.Minute))
	w.p = sharedSeatsOf(Config{Limit: limit}, w.clock, &w.shared)
	return w
}

// wait starts a call asking for a seat and returns once it is the waiters-th in line.
func (w *sharedWaiters) wait(name string, ask Ask, waiters int) {
	go func() {
		s, err := w.p.Acquire(context.Background(), ask, 0)
		if err != nil {
			w.t.Error(err)
		}
		w.seats <- namedSeat{name, s}
	}()
	// It gave its local seat back and waits in line, and a look for it has begun: any look
	// still under way stands the best of the waiters, not one chosen before this one came.
	pollUntil(w.t, w.clock, "the waiter in line without a local seat", func() bool {
		return w.shared.Load().waiters() == waiters && w.p.Snapshot().InUse == 0 && w.shared.Load().lookedForAll()
	})
}

// locked reads what read reads of s under its lock.
func locked[T any](s *Shared, read func() T) T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return read()
}

// lookCount is how many looks s has begun.
func (s *Shared) lookCount() uint64 { return locked(s, func() uint64 { return s.looks }) }

// lookedForAll says whether a look began after each waiter came.
func (s *Shared) lookedForAll() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.waiting {
		if w.after >= s.looks {
			return false
		}
	}
	return true
}

// servedInOrder frees the other replica's seat and checks that the waiters get it in the
// order want names, each releasing it for the next.
func (w *sharedWaiters) servedInOrder(want ...string) {
	if err := w.st.ReleaseSeat("test", "other"); err != nil {
		w.t.Fatal(err)
	}
	for _, name := range want {
		pollUntil(w.t, w.clock, "a waiter served", func() bool { return len(w.seats) > 0 })
		g := <-w.seats
		if g.name != name {
			w.t.Fatalf("waiter %s got the freed shared seat before waiter %s", g.name, name)
		}
		g.s.Release(Sample{})
	}
}

// A waiter gets ErrNoSeat once a look after its deadline found none, not before: its deadline
// is read on the clock.
func TestSharedSeatWaiterGetsNoSeatAtItsDeadlineOnTheClock(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	st := openSeats(t, pgtest.Database(t), clock)
	heldByOther(t, st)
	s := newTestShared(st, clock, time.Minute)
	began := clock.Now()
	deadline := began.Add(5 * sharedPoll)
	answer := make(chan error, 1)
	go func() {
		_, err := s.Take(context.Background(), deadline, 3, "k", 1)
		answer <- err
	}()
	pollUntil(t, clock, "the waiter answered", func() bool { return len(answer) > 0 })
	if err := <-answer; !errors.Is(err, ErrNoSeat) {
		t.Fatalf("a waiter past its deadline: %v; want ErrNoSeat", err)
	}
	if clock.Now().Before(deadline) {
		t.Fatalf("answered %v after it came; its deadline was %v", clock.Since(began), deadline.Sub(began))
	}
}

// A replica whose clock runs ten minutes ahead, or behind, does not take the seat another
// replica holds for a minute: the storage reads leases on its own clock, not the replica's.
func TestSharedSeatOfAnotherReplicaHoldsWhateverThisReplicasClockSays(t *testing.T) {
	for _, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
		clock := clockwork.NewFakeClockAt(time.Now().Add(skew))
		st := openSeats(t, pgtest.Database(t), clock)
		heldByOther(t, st)
		s := newTestShared(st, clock, time.Minute)
		answer := make(chan error, 1)
		go func() {
			_, err := s.Take(context.Background(), clock.Now().Add(5*sharedPoll), 3, "k", 1)
			answer <- err
		}()
		pollUntil(t, clock, "the waiter answered", func() bool { return len(answer) > 0 })
		if err := <-answer; !errors.Is(err, ErrNoSeat) {
			t.Fatalf("a replica %v off took the seat another holds: %v; want ErrNoSeat", skew, err)
		}
	}
}

// inLine reports whether worker has a call in the fleet's line for pool "test" in the database
// of dsn.
func inLine(t *testing.T, dsn, worker string) bool {
	t.Helper()
	return pgtest.Count(t, dsn, `SELECT count(*) FROM seat_waiters WHERE pool = 'test' AND worker = $1`, worker) == 1
}

// With `shared 1` on two replicas, the seat that comes free goes to the fleet's most urgent
// waiter, not to the replica that looks first: a u=7 call waiting on one replica since before
// a u=0 call came to the other does not take it, though its replica looks first; it takes the
// next. Once nobody waits, neither replica stands in line.
func TestSharedSeatGoesToTheFleetsMostUrgentWaiter(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	dsn := pgtest.Database(t)
	stA, stB := openSeats(t, dsn, clock), openSeats(t, dsn, clock)
	heldByOther(t, stA)
	lookA := &inFlightSeats{SharedSeats: stA}
	a, b := newReplicaShared(lookA, clock, time.Minute, "a"), newReplicaShared(stB, clock, time.Minute, "b")
	calls := newFleetCalls(t, clock, dsn)
	calls.wait("batch", a, 7)
	calls.wait("urgent", b, 0)
	if err := stA.ReleaseSeat("test", "other"); err != nil {
		t.Fatal(err)
	}
	looked := lookA.takes.Load()
	a.kick <- struct{}{} // the batch call's replica looks first, before the clock moves
	testkit.WaitFor(t, 10*time.Second, "the batch call's replica looked", func() bool {
		return lookA.takes.Load() > looked && lookA.now.Load() == 0
	})
	// The urgent call's replica may have taken the seat already: told of it (store.SeatNotices),
	// it need not wait for its next look.
	if order := calls.served(2); order[0] != "urgent" {
		t.Fatalf("served %v: the batch call took the freed seat the urgent call on the other replica is due", order)
	}
	testkit.WaitFor(t, 10*time.Second, "both replicas out of the line", func() bool {
		return !inLine(t, dsn, "a") && !inLine(t, dsn, "b")
	})
}

// fleetCalls are calls a test has wait for shared seats on its replicas, on a fake clock.
type fleetCalls struct {
	t     *testing.T
	clock *clockwork.FakeClock
	dsn   string
	seats chan fleetGrant
}

// fleetGrant is the seat a call of fleetCalls got, from replica s.
type fleetGrant struct {
	name string
	s    *Shared
	h    *Held
}

func newFleetCalls(t *testing.T, clock *clockwork.FakeClock, dsn string) *fleetCalls {
	return &fleetCalls{t: t, clock: clock, dsn: dsn, seats: make(chan fleetGrant, 8)}
}

// wait has a call named name (its key too) wait for a seat of s at urgency, once the calls
// waiting on s before it are served: it returns once the call stands in the fleet's line.
func (f *fleetCalls) wait(name string, s *Shared, urgency int) {
	go func() {
		h, err := s.Take(context.Background(), time.Time{}, urgency, name, 1)
		if err != nil {
			f.t.Error(err)
		}
		f.seats <- fleetGrant{name, s, h}
	}()
	pollUntil(f.t, f.clock, name+" in the fleet's line", func() bool { return s.waiters() == 1 && inLine(f.t, f.dsn, s.worker) })
}

// served gives each seat back as it is granted, until n calls were served, and returns their
// names in the order served.
func (f *fleetCalls) served(n int) []string {
	var order []string
	for len(order) < n {
		pollUntil(f.t, f.clock, "a waiter served", func() bool { return len(f.seats) > 0 })
		g := <-f.seats
		order = append(order, g.name)
		g.s.Give(g.h)
	}
	return order
}

// A key served on one replica waits its turn on the others: the fleet keeps the keys' turns for
// shared seats (store.SeatTurns). Replica b has a call of key busy, then one of key quiet; replica
// a's call of busy, a key served before, came first and takes the seat that comes free. b's quiet
// call then goes before b's busy call. Counting b's own turns only, busy, never served on b,
// went first; on three replicas, minted credentials ranked so in the fleet's line
// (docs/capacity.md). On the real clock: the fleet's turns are read as lengths of time on the
// database's clock, which a test clock that jumps would not match.
func TestSharedSeatKeysTakeTurnsAcrossTheFleet(t *testing.T) {
	clock := clockwork.NewRealClock()
	dsn := pgtest.Database(t)
	stA, stB := openSeats(t, dsn, clock), openSeats(t, dsn, clock)
	a, b := newReplicaShared(stA, clock, time.Minute, "a"), newReplicaShared(stB, clock, time.Minute, "b")
	h, err := a.Take(context.Background(), time.Time{}, 3, "busy", 1)
	if err != nil {
		t.Fatal(err)
	}
	a.Give(h)
	heldByOther(t, stA)
	type got struct {
		name string
		s    *Shared
		h    *Held
	}
	seats := make(chan got, 3)
	// A quarter of a second apart: the line ranks calls by how long they waited, each replica
	// telling it from its look, some milliseconds (more on a loaded machine) before the
	// database reads it.
	wait := func(name, key string, s *Shared, n int) {
		time.Sleep(250 * time.Millisecond)
		go func() {
			h, err := s.Take(context.Background(), time.Time{}, 3, key, 1)
			if err != nil {
				t.Error(err)
			}
			seats <- got{name, s, h}
		}()
		testkit.WaitFor(t, 10*time.Second, name+" in the fleet's line", func() bool { return s.waiters() == n && inLine(t, dsn, s.worker) })
	}
	wait("busy-a", "busy", a, 1)
	wait("busy-b", "busy", b, 1)
	wait("quiet-b", "quiet", b, 2)
	time.Sleep(250 * time.Millisecond) // busy-a's seat comes after quiet-b came
	if err := stA.ReleaseSeat("test", "other"); err != nil {
		t.Fatal(err)
	}
	var order []string
	for len(order) < 3 {
		var g got
		select {
		case g = <-seats:
		case <-time.After(10 * time.Second):
			t.Fatalf("not within 10s: served %v, then nobody", order)
		}
		order = append(order, g.name)
		if g.name == "busy-a" {
			// A look of b's under way may have read the fleet's turns before busy-a's seat
			// moved busy's on (a replica picks its call with the turns of its latest look):
			// busy-a's seat goes back once b's next look has begun, after it.
			looked := b.lookCount()
			testkit.WaitFor(t, 10*time.Second, "a look of b's after busy-a's seat", func() bool { return b.lookCount() > looked })
		}
		g.s.Give(g.h)
	}
	if want := []string{"busy-a", "quiet-b", "busy-b"}; !slices.Equal(order, want) {
		t.Fatalf("served %v; want %v", order, want)
	}
}

// proxiedSeats is a PostgreSQL store on clock reached through a loopback proxy the test can
// cut, as a network partition cuts a replica off its database.
func proxiedSeats(t *testing.T, clock clockwork.Clock) (*postgres.Store, *testkit.CutProxy, string) {
	t.Helper()
	dsn := pgtest.Database(t)
	cut, proxy := testkit.CutDSN(t, dsn)
	return openSeats(t, cut, clock), proxy, dsn
}

// A call whose shared seat cannot be renewed (its replica cut off its database) is cut the
// margin before the seat's lease ends on the clock, whatever the renewals do: then another
// replica may take the seat.
func TestSharedSeatThatCannotBeRenewedCutsItsCallBeforeItsLeaseEnds(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	st, proxy, _ := proxiedSeats(t, clock)
	const lease, margin = 10 * time.Second, time.Second
	s := newTestShared(st, clock, lease)
	taken := clock.Now()
	h, err := s.Take(context.Background(), time.Time{}, 3, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := s.Watch(context.Background(), h)
	defer stop()
	proxy.Cut()
	for clock.Since(taken) < lease-margin-time.Second {
		clock.Advance(time.Second) // a renewal each second, each failing
		if ctx.Err() != nil {
			t.Fatalf("the call was cut %v after its seat was taken; its lease runs %v", clock.Since(taken), lease)
		}
	}
	clock.Advance(time.Second)
	testkit.WaitFor(t, 5*time.Second, "the call cut", func() bool { return ctx.Err() != nil })
	if cause := context.Cause(ctx); !errors.Is(cause, ErrSeatLapsed) {
		t.Fatalf("the call was cut by %v; want ErrSeatLapsed", cause)
	}
}

// A seat the storage no longer has (it lapsed, and another replica may hold its place) cuts its
// call at the next renewal.
func TestSharedSeatLostInStorageCutsItsCallAtTheNextRenewal(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	st := openSeats(t, pgtest.Database(t), clock)
	s := newTestShared(st, clock, time.Minute)
	h, err := s.Take(context.Background(), time.Time{}, 3, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := s.Watch(context.Background(), h)
	defer stop()
	if err := st.ReleaseSeat("test", h.id); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the call cut", func() bool {
		if ctx.Err() != nil {
			return true
		}
		clock.Advance(time.Second) // the renewal's pace with a lease of a minute
		return false
	})
	if cause := context.Cause(ctx); !errors.Is(cause, ErrSeatLapsed) {
		t.Fatalf("the call was cut by %v; want ErrSeatLapsed", cause)
	}
	if lease := h.until.Sub(clock.Now()); lease < time.Minute-10*time.Second {
		t.Fatalf("the call was cut only %v before its lease ended; want at the next renewal", lease)
	}
}

// A shared seat whose release failed (the database blipped) comes back to the other replicas:
// the release is retried, and the replica does not renew a seat none of its calls holds. With
// shared 1, another replica then takes the seat, rather than finding it "held, renewed" for as
// long as this replica lives.
func TestSharedSeatWhoseReleaseFailedComesBack(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	st, proxy, dsn := proxiedSeats(t, clock)
	other := openSeats(t, dsn, clock)
	var shared atomic.Pointer[Shared]
	shared.Store(newTestShared(st, clock, time.Second))
	p := sharedSeatsOf(Config{Limit: 1}, clock, &shared)
	s, err := p.Acquire(context.Background(), Ask{Scope: "a", Since: clock.Now()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	s.Release(Sample{}) // fails: the database is out of reach
	proxy.Restore()
	if n := p.Snapshot().InUse; n != 0 {
		t.Fatalf("%d local seats in use after the release; want 0", n)
	}
	// The lease runs on the database's clock: the seat lapses a real second after it was taken,
	// whatever the replica's clock says, and is never renewed meanwhile.
	released := time.Now()
	testkit.WaitFor(t, 10*time.Second, "another replica takes the shared seat (lease 1s)", func() bool {
		if ok, err := other.AcquireSeat("test", "b", "w2", 1, time.Minute, store.SeatWaiter{}); ok && err == nil {
			return true
		}
		if time.Since(released) > 5*time.Second {
			t.Fatalf("the shared seat still held %v after its release, with a lease of 1s", time.Since(released))
		}
		clock.Advance(50 * time.Millisecond)
		return false
	})
}

// inFlightSeats is a real PostgreSQL store's shared seats, counting the looks for a seat and
// the most of them under way at once.
type inFlightSeats struct {
	store.SharedSeats
	takes, now, most atomic.Int64
}

func (c *inFlightSeats) AcquireSeat(pool, seat, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	c.takes.Add(1)
	n := c.now.Add(1)
	defer c.now.Add(-1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	return c.SharedSeats.AcquireSeat(pool, seat, worker, limit, lease, w)
}

// xactCommits reads the transactions committed in the database of dsn so far.
func xactCommits(t *testing.T, dsn string) int64 {
	t.Helper()
	return int64(pgtest.Count(t, dsn, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`))
}

// 100 calls wait for the one shared seat another replica holds: the replica looks for a free
// seat for all of them with one transaction at a time, not one each every poll. It runs on the
// real clock, at the poller's real pace: run with -v for the transactions per second the
// database served meanwhile (docs/capacity.md).
func TestSharedSeatWaitersLookForASeatOneAtATime(t *testing.T) {
	clock := clockwork.NewRealClock()
	dsn := pgtest.Database(t)
	st := openSeats(t, dsn, clock)
	heldByOther(t, st)
	seats := &inFlightSeats{SharedSeats: st}
	const waiters = 100
	var shared atomic.Pointer[Shared]
	shared.Store(newTestShared(seats, clock, time.Minute))
	p := sharedSeatsOf(Config{Limit: waiters}, clock, &shared)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range waiters {
		wg.Go(func() {
			if _, err := p.Acquire(ctx, Ask{Scope: "a", Since: clock.Now()}, 0); err == nil {
				t.Error("a waiter got the seat the other replica holds")
			}
		})
	}
	testkit.WaitFor(t, 30*time.Second, "waiters looking", func() bool { return seats.takes.Load() >= waiters })
	began, commits, takes := time.Now(), xactCommits(t, dsn), seats.takes.Load()
	testkit.WaitFor(t, 60*time.Second, "200 more looks", func() bool { return seats.takes.Load() >= takes+200 })
	time.Sleep(time.Second) // pg_stat_database is flushed about once a second: measured, not asserted
	secs := time.Since(began).Seconds()
	t.Logf("%d waiters: %.0f looks/s, %.0f transactions/s committed in the database, at most %d looks at once",
		waiters, float64(seats.takes.Load()-takes)/secs, float64(xactCommits(t, dsn)-commits)/secs, seats.most.Load())
	cancel()
	wg.Wait()
	if m := seats.most.Load(); m != 1 {
		t.Fatalf("%d looks for a shared seat under way at once for %d waiters; want 1 (one look for all)", m, waiters)
	}
}

// A seat another replica frees is told to this one at once (store.SeatNotices: PostgreSQL's
// NOTIFY), and its waiting call takes it without waiting for its next look: here the clock
// never moves, so no look is ever due.
func TestSharedSeatFreedByAnotherReplicaIsTakenAtOnce(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	dsn := pgtest.Database(t)
	other, mine := openSeats(t, dsn, clock), openSeats(t, dsn, clock)
	heldByOther(t, other)
	s := newTestShared(mine, clock, time.Minute)
	answer := takeAndGive(s, "k")
	testkit.WaitFor(t, 10*time.Second, "the first look, which finds the seat held", func() bool { return inLine(t, dsn, "w") })
	if err := other.ReleaseSeat("test", "other"); err != nil {
		t.Fatal(err)
	}
	if err := testkit.Receive(t, answer, "the waiting call's seat, with no look due"); err != nil {
		t.Fatal(err)
	}
}

// countedSeats counts what a replica asks of its PostgreSQL store for shared seats.
type countedSeats struct {
	*postgres.Store
	looks, releases, handovers, withdrawals atomic.Int64
}

func (c *countedSeats) WithdrawWaiter(pool, worker string) error {
	defer c.withdrawals.Add(1) // once done, so that a test reads the line after it
	return c.Store.WithdrawWaiter(pool, worker)
}

func (c *countedSeats) AcquireSeat(pool, seat, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	c.looks.Add(1)
	return c.Store.AcquireSeat(pool, seat, worker, limit, lease, w)
}

func (c *countedSeats) ReleaseSeat(pool, seat string) error {
	c.releases.Add(1)
	return c.Store.ReleaseSeat(pool, seat)
}

func (c *countedSeats) HandOverSeat(pool, seat, next, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	c.handovers.Add(1)
	return c.Store.HandOverSeat(pool, seat, next, worker, limit, lease, w)
}

// takeAndGive asks s for a seat for a call of key, with no deadline, gives it back at once, and
// returns the answer.
func takeAndGive(s *Shared, key string) <-chan error {
	answer := make(chan error, 1)
	go func() {
		h, err := s.Take(context.Background(), time.Time{}, 3, key, 1)
		if err == nil {
			s.Give(h)
		}
		answer <- err
	}()
	return answer
}

// takeLater asks s for a seat for a call of key, with no deadline, and returns where it comes.
func takeLater(t *testing.T, s *Shared, key string) <-chan *Held {
	got := make(chan *Held, 1)
	go func() {
		h, err := s.Take(context.Background(), time.Time{}, 3, key, 1)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	return got
}

// A seat given back while a call of the same replica waits goes to that call in one step
// (store.SeatHandover): no release, notice and look between them while the model server's slot
// is free. Before, the seat was released, then found by the poller's next look. Once nobody
// waits, the replica is out of the fleet's line.
func TestASeatGivenBackWhileTheReplicasCallsWaitIsHandedOverInOneStep(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	dsn := pgtest.Database(t)
	st := &countedSeats{Store: openSeats(t, dsn, clock)}
	s := newTestShared(st, clock, time.Minute)
	h, err := s.Take(context.Background(), time.Time{}, 3, "first", 1)
	if err != nil {
		t.Fatal(err)
	}
	got := takeLater(t, s, "second")
	pollUntil(t, clock, "the second call in the fleet's line", func() bool { return s.waiters() == 1 && inLine(t, dsn, "w") })
	looks, releases := st.looks.Load(), st.releases.Load()
	s.Give(h) // the clock stands still: no look is due
	var second *Held
	select {
	case second = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the second call got no seat within 10s of the first's being given back")
	}
	if n, r, ho := st.looks.Load()-looks, st.releases.Load()-releases, st.handovers.Load(); n != 0 || r != 0 || ho != 1 {
		t.Fatalf("the seat went on with %d looks, %d releases and %d handovers; want one handover alone", n, r, ho)
	}
	if inLine(t, dsn, "w") {
		t.Fatal("the replica still stands in line: its call was served")
	}
	s.Give(second)
	if n := pgtest.Count(t, dsn, `SELECT count(*) FROM seats WHERE pool = 'test'`); n != 0 {
		t.Fatalf("%d seats held after both calls gave theirs back", n)
	}
}

// replicaBehindOther makes replica "w" of pool "test" (`shared 1`), its store wrapped by wrap,
// on a fake clock, the one seat held by another replica.
func replicaBehindOther(t *testing.T, wrap func(*postgres.Store) store.SharedSeats) (*clockwork.FakeClock, string, *Shared) {
	clock := clockwork.NewFakeClockAt(time.Now())
	dsn := pgtest.Database(t)
	st := openSeats(t, dsn, clock)
	heldByOther(t, st)
	return clock, dsn, newTestShared(wrap(st), clock, time.Minute)
}

// twoReplicas makes replicas a, its store wrapped by wrap, and b of pool "test" (`shared 1`)
// on one database, on a fake clock; a holds the seat, h.
func twoReplicas(t *testing.T, wrap func(*postgres.Store) store.SharedSeats) (clock *clockwork.FakeClock, dsn string, a, b *Shared, h *Held) {
	clock = clockwork.NewFakeClockAt(time.Now())
	dsn = pgtest.Database(t)
	a = newReplicaShared(wrap(openSeats(t, dsn, clock)), clock, time.Minute, "a")
	b = newReplicaShared(openSeats(t, dsn, clock), clock, time.Minute, "b")
	h, err := a.Take(context.Background(), time.Time{}, 3, "first", 1)
	if err != nil {
		t.Fatal(err)
	}
	return clock, dsn, a, b, h
}

// A seat handed over goes to the fleet's better call on another replica when there is one: the
// replica that gives it back has a u=7 call waiting, another replica a u=0 call; the u=0 call
// gets the seat, and the u=7 call the next. Once nobody waits, neither replica stands in line.
func TestASeatHandedOverGoesToTheFleetsBetterCallOnAnotherReplica(t *testing.T) {
	var stA *countedSeats
	clock, dsn, a, b, h := twoReplicas(t, func(st *postgres.Store) store.SharedSeats {
		stA = &countedSeats{Store: st}
		return stA
	})
	calls := newFleetCalls(t, clock, dsn)
	calls.wait("batch", a, 7)
	calls.wait("urgent", b, 0)
	a.Give(h)
	if stA.handovers.Load() != 1 {
		t.Fatalf("%d handovers; want the seat handed over once", stA.handovers.Load())
	}
	if order, want := calls.served(2), []string{"urgent", "batch"}; !slices.Equal(order, want) {
		t.Fatalf("served %v; want %v: the seat handed over went past the fleet's better call", order, want)
	}
	testkit.WaitFor(t, 10*time.Second, "both replicas out of the line", func() bool {
		return !inLine(t, dsn, "a") && !inLine(t, dsn, "b")
	})
}

// A call that goes before every call waiting on its replica is stood in the fleet's line at once,
// not at the replica's next poll (up to 20 ms later, while the free seat it is due may go to
// another replica's call): here the clock stands still after a u=7 call stood in line, and the
// u=0 call that comes takes its place.
func TestACallThatGoesFirstIsStoodInTheFleetsLineAtOnce(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	dsn := pgtest.Database(t)
	st := openSeats(t, dsn, clock)
	heldByOther(t, st)
	s := newTestShared(st, clock, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := func(urgency int) {
		go func() { _, _ = s.Take(ctx, time.Time{}, urgency, "k", 1) }()
	}
	standing := func(urgency int) func() bool {
		return func() bool {
			return pgtest.Count(t, dsn, `SELECT count(*) FROM seat_waiters WHERE pool = 'test' AND worker = 'w' AND urgency = $1`, urgency) == 1
		}
	}
	wait(7)
	pollUntil(t, clock, "the u=7 call in line", standing(7))
	wait(0)
	testkit.WaitFor(t, 5*time.Second, "the u=0 call in line, the clock standing still", standing(0))
}

// A handover that serves one of a replica's calls takes the replica out of the fleet's line with
// it; its next call waiting stands there at once, not at the next poll. With `shared 2`, replica
// a hands its seat to a1 while a2 (u=0) still waits; replica b, whose u=7 call waits, then gives
// its seat back: a2 takes it, the clock standing still. Before, a stood nowhere until its next
// poll, and b handed the seat to its own u=7 call.
func TestAfterAHandoverTheReplicasNextCallStandsInLineAtOnce(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	dsn := pgtest.Database(t)
	a, b := newReplicaShared(openSeats(t, dsn, clock), clock, time.Minute, "a"), newReplicaShared(openSeats(t, dsn, clock), clock, time.Minute, "b")
	a.SetLimit(2)
	b.SetLimit(2)
	held := map[*Shared]*Held{}
	for _, s := range []*Shared{a, b} {
		h, err := s.Take(context.Background(), time.Time{}, 3, "first", 1)
		if err != nil {
			t.Fatal(err)
		}
		held[s] = h
	}
	served := make(chan string, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // b1 still waits
	wait := func(name string, s *Shared, urgency, n int) {
		go func() {
			if _, err := s.Take(ctx, time.Time{}, urgency, name, 1); err != nil {
				if ctx.Err() == nil {
					t.Error(err)
				}
				return
			}
			served <- name
		}()
		pollUntil(t, clock, name+" waiting, in line", func() bool { return s.waiters() == n && inLine(t, dsn, s.worker) })
	}
	wait("a1", a, 0, 1)
	wait("a2", a, 0, 2)
	wait("b1", b, 7, 1)
	a.Give(held[a])
	if first := <-served; first != "a1" {
		t.Fatalf("a's seat went to %s; want a1", first)
	}
	testkit.WaitFor(t, 5*time.Second, "a2 in the fleet's line", func() bool {
		return pgtest.Count(t, dsn, `SELECT count(*) FROM seat_waiters WHERE pool = 'test' AND worker = 'a' AND key = 'a2'`) == 1
	})
	b.Give(held[b])
	select {
	case next := <-served:
		if next != "a2" {
			t.Fatalf("the seat b gave back went to %s, past a's u=0 call a2", next)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nobody served within 10s of b's seat given back")
	}
}

// Two seats given back at once while one call waits: one is handed over to it, the other
// released for the rest of the fleet at once, not taken for nobody and released after.
func TestSeatsGivenBackAtOnceAreHandedOverOneForEachCallWaiting(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	dsn := pgtest.Database(t)
	st := &countedSeats{Store: openSeats(t, dsn, clock)}
	s := newTestShared(st, clock, time.Minute)
	s.SetLimit(2)
	var held []*Held
	for range 2 {
		h, err := s.Take(context.Background(), time.Time{}, 3, "first", 1)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
	}
	got := takeLater(t, s, "waiting")
	pollUntil(t, clock, "a call waiting, in line", func() bool { return s.waiters() == 1 && inLine(t, dsn, "w") })
	var wg sync.WaitGroup
	for _, h := range held {
		wg.Go(func() { s.Give(h) })
	}
	wg.Wait()
	s.Give(<-got)
	if ho, r := st.handovers.Load(), st.releases.Load(); ho != 1 || r != 2 {
		t.Fatalf("%d handovers and %d releases; want 1 handover and 2 releases (the other seat, then the call's)", ho, r)
	}
}

// gatedSeats holds every look for a shared seat while its gate is shut.
type gatedSeats struct {
	ownTurns
	shut atomic.Bool
	open chan struct{}
}

func (g *gatedSeats) AcquireSeat(pool, seat, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	if g.shut.Load() {
		<-g.open
	}
	return g.ownTurns.AcquireSeat(pool, seat, worker, limit, lease, w)
}

// A call that comes while calls of its replica wait for a shared seat, and goes after them,
// holds no local seat while it waits: it gives the one it took back at once rather than hold it
// through a look of its own, so the call that wins the next shared seat finds a local seat free
// instead of holding the fleet's seat idle while it waits for one. Here the second call's look,
// had it made one, would hang with the local seat held. The clock stands still: no look is due.
func TestACallThatComesBehindOthersWaitingHoldsNoLocalSeatWhileItWaits(t *testing.T) {
	w := newSharedWaiters(t, 1)
	gated := &gatedSeats{ownTurns: ownTurns{w.st, w.st, w.st}, open: make(chan struct{})}
	w.shared.Store(newTestShared(gated, w.clock, time.Minute))
	w.wait("first", Ask{Urgency: 7, Scope: "a", Since: w.clock.Now()}, 1)
	gated.shut.Store(true)
	go func() {
		s, err := w.p.Acquire(context.Background(), Ask{Urgency: 7, Scope: "b", Since: w.clock.Now()}, 0)
		if err != nil {
			w.t.Error(err)
		}
		w.seats <- namedSeat{"second", s}
	}()
	testkit.WaitFor(t, 5*time.Second, "the second call waiting without a local seat", func() bool {
		return w.shared.Load().waiters() == 2 && w.p.Snapshot().InUse == 0
	})
	gated.shut.Store(false)
	close(gated.open)
	w.servedInOrder("first", "second")
}

// lostHandovers hands seats over in the storage once its gate opens, then loses the answer; it
// counts the withdrawals from the line asked for after the gate opened, once each is done.
type lostHandovers struct {
	*postgres.Store
	open      chan struct{}
	withdrawn atomic.Int64
}

func (l *lostHandovers) WithdrawWaiter(pool, worker string) error {
	opened := false
	select {
	case <-l.open:
		opened = true
	default:
	}
	err := l.Store.WithdrawWaiter(pool, worker)
	if opened {
		l.withdrawn.Add(1) // once done, so the test reads the line after it
	}
	return err
}

func (l *lostHandovers) HandOverSeat(pool, seat, next, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	<-l.open
	if _, err := l.Store.HandOverSeat(pool, seat, next, worker, limit, lease, w); err != nil {
		return false, err
	}
	return false, errors.New("the handover's answer was lost")
}

// handingOver counts s's handovers under way.
func (s *Shared) handingOver() int { return locked(s, func() int { return s.handing }) }

// asking counts the calls asking s for a seat, waiting or making their one look.
func (s *Shared) asking() int { return locked(s, func() int { return len(s.waiting) }) }

// isPolling says whether s's poller runs.
func (s *Shared) isPolling() bool { return locked(s, func() bool { return s.polling }) }

// A handover whose answer was lost leaves no place in the fleet's line: replica a gives its seat
// back while its u=7 call waits, and the handover stands that call in line (the seat is due to
// b's u=0 call); meanwhile a's call left and a's poller ended, out of the line. Before, the
// place the lost handover stood stayed in the line, holding back the fleet's calls behind it
// for a second, and for good had the replica kept looking.
func TestAHandoverWhoseAnswerWasLostLeavesNoPlaceInTheLine(t *testing.T) {
	var lost *lostHandovers
	clock, dsn, a, b, h := twoReplicas(t, func(st *postgres.Store) store.SharedSeats {
		lost = &lostHandovers{Store: st, open: make(chan struct{})}
		return lost
	})
	calls := newFleetCalls(t, clock, dsn)
	calls.wait("urgent", b, 0)
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := a.Take(ctx, time.Time{}, 7, "batch", 1)
		left <- err
	}()
	pollUntil(t, clock, "a's call in the fleet's line", func() bool { return a.waiters() == 1 && inLine(t, dsn, "a") })
	gave := make(chan struct{})
	go func() {
		a.Give(h)
		close(gave)
	}()
	testkit.WaitFor(t, 5*time.Second, "a's handover under way", func() bool { return a.handingOver() == 1 })
	cancel()
	if err := testkit.Receive(t, left, "a's call leaving"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a's call left with %v", err)
	}
	pollUntil(t, clock, "a's poller ended, out of the line", func() bool { return !a.isPolling() && !inLine(t, dsn, "a") })
	close(lost.open)
	<-gave
	// The handover stood a's call in line again, in the storage, and b's call took the seat.
	if order := calls.served(1); order[0] != "urgent" {
		t.Fatalf("served %v", order)
	}
	testkit.WaitFor(t, 10*time.Second, "a leaving the line after its lost handover", func() bool { return lost.withdrawn.Load() == 1 })
	if inLine(t, dsn, "a") {
		t.Fatal("a still stands in the fleet's line after leaving it")
	}
}

// A call only making its one look for a shared seat, nobody waiting for one here, does not
// count as waiting: a call that comes meanwhile makes its one look too, holding its local seat,
// rather than give that back and wait behind a call that is not waiting. Here the first look
// hangs at the gate, and the second call is asking, holding its local seat, for the next look.
// Before, the second call counted the first as waiting and gave its local seat back.
func TestACallMakingItsOneLookDoesNotCountAsWaiting(t *testing.T) {
	w := newSharedWaiters(t, 2)
	gated := &gatedSeats{ownTurns: ownTurns{w.st, w.st, w.st}, open: make(chan struct{})}
	w.shared.Store(newTestShared(gated, w.clock, time.Minute))
	gated.shut.Store(true)
	for i, name := range []string{"first", "second"} {
		go func() {
			s, err := w.p.Acquire(context.Background(), Ask{Scope: name, Since: w.clock.Now()}, 0)
			if err != nil {
				w.t.Error(err)
			}
			w.seats <- namedSeat{name, s}
		}()
		// Its local seat held through its look: it asked for a shared seat holding it.
		testkit.WaitFor(t, 5*time.Second, name+" asking for a shared seat, holding its local seat", func() bool {
			return w.shared.Load().asking() == i+1 && w.p.Snapshot().InUse == i+1
		})
	}
	if n := w.shared.Load().waiters(); n != 0 {
		t.Fatalf("%d calls counted as waiting for a shared seat; want none: both are making their one look", n)
	}
	gated.shut.Store(false)
	close(gated.open)
	if err := w.st.ReleaseSeat("test", "other"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		pollUntil(t, w.clock, "a call served", func() bool { return len(w.seats) > 0 })
		if g := <-w.seats; g.s != nil { // nil: its Acquire failed, which the test reported
			g.s.Release(Sample{})
		}
	}
}

// A look that takes a seat takes the replica's place out of the fleet's line with it: once its
// call is served and nobody else waits, the replica asks the storage for nothing more. Before,
// the replica counted as in line still, and withdrew a place that was no longer there.
func TestALookThatTakesASeatLeavesNothingToWithdraw(t *testing.T) {
	var st *countedSeats
	clock, dsn, s := replicaBehindOther(t, func(pg *postgres.Store) store.SharedSeats {
		st = &countedSeats{Store: pg}
		return st
	})
	got := takeLater(t, s, "k")
	pollUntil(t, clock, "the call in the fleet's line", func() bool { return s.waiters() == 1 && inLine(t, dsn, "w") })
	if err := st.ReleaseSeat("test", "other"); err != nil {
		t.Fatal(err)
	}
	var h *Held
	pollUntil(t, clock, "the call served", func() bool {
		select {
		case h = <-got:
			return true
		default:
			return false
		}
	})
	pollUntil(t, clock, "the poller ended", func() bool { return !s.isPolling() })
	if inLine(t, dsn, "w") {
		t.Fatal("the replica stands in the fleet's line after its one call was served")
	}
	if n := st.withdrawals.Load(); n != 0 {
		t.Fatalf("%d withdrawals from the line after the look that served took the place out; want none", n)
	}
	s.Give(h)
}

// gatedLooks holds a look's answer, once its transaction is done, until open is closed; it
// counts the withdrawals done.
type gatedLooks struct {
	countedSeats
	armed  atomic.Bool
	looked chan bool
	open   chan struct{}
}

func (g *gatedLooks) AcquireSeat(pool, seat, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	ok, err := g.countedSeats.AcquireSeat(pool, seat, worker, limit, lease, w)
	if g.armed.CompareAndSwap(true, false) {
		g.looked <- ok
		<-g.open
	}
	return ok, err
}

// A handover answered while a look that took a seat is under way, which committed after the
// look and stood a place, keeps the replica in line: once nobody waits, it withdraws. With
// `shared 2`, a's call x takes the free seat by a look whose answer is held; b's u=0 call then
// stands in line, and a gives its other seat back: the handover for x is not served (b's call
// is ahead) and stands a's place, after the look's commit.
func TestAHandoverAnsweredDuringALookThatTookASeatKeepsThePlace(t *testing.T) {
	var g *gatedLooks
	clock, dsn, a, b, h := twoReplicas(t, func(st *postgres.Store) store.SharedSeats {
		g = &gatedLooks{countedSeats: countedSeats{Store: st}, looked: make(chan bool, 1), open: make(chan struct{})}
		return g
	})
	a.SetLimit(2)
	b.SetLimit(2)
	g.armed.Store(true)
	got := takeLater(t, a, "x")
	if ok := testkit.Receive(t, g.looked, "a's look, held after its commit"); !ok {
		t.Fatal("a's look took no seat")
	}
	calls := newFleetCalls(t, clock, dsn)
	calls.wait("urgent", b, 0)
	a.Give(h)
	if !inLine(t, dsn, "a") {
		t.Fatal("the handover stood no place for a")
	}
	close(g.open)
	hx := testkit.Receive(t, got, "x served by the look")
	pollUntil(t, clock, "a's poller ended", func() bool { return !a.isPolling() })
	testkit.WaitFor(t, 5*time.Second, "a withdrawing the place the handover stood", func() bool { return g.withdrawals.Load() == 1 })
	if inLine(t, dsn, "a") {
		t.Fatal("a stands in line with nobody waiting")
	}
	a.Give(hx)
	calls.served(1)
}

// servedButFailed answers one look "taken" with an error, having written nothing: a commit that
// failed after the statement's row was read.
type servedButFailed struct {
	countedSeats
	armed atomic.Bool
}

func (f *servedButFailed) AcquireSeat(pool, seat, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	if f.armed.CompareAndSwap(true, false) {
		return true, errors.New("the commit failed after the row was read")
	}
	return f.countedSeats.AcquireSeat(pool, seat, worker, limit, lease, w)
}

// A look answered "taken" with an error took nothing: its call gets the storage's error, not a
// seat nobody holds, and the replica still counts as in line, so it withdraws the place an
// earlier look stood. Before, the call was given the seat, and the place stayed.
func TestALookAnsweredTakenWithAnErrorTookNothing(t *testing.T) {
	var st *servedButFailed
	clock, dsn, s := replicaBehindOther(t, func(pg *postgres.Store) store.SharedSeats {
		st = &servedButFailed{countedSeats: countedSeats{Store: pg}}
		return st
	})
	answer := takeAndGive(s, "k")
	pollUntil(t, clock, "the call in the fleet's line", func() bool { return s.waiters() == 1 && inLine(t, dsn, "w") })
	st.armed.Store(true)
	pollUntil(t, clock, "the call answered", func() bool { return len(answer) > 0 })
	if err := <-answer; err == nil || errors.Is(err, ErrNoSeat) {
		t.Fatalf("the call's answer: %v; want the storage's error", err)
	}
	pollUntil(t, clock, "the poller ended", func() bool { return !s.isPolling() })
	testkit.WaitFor(t, 5*time.Second, "the replica withdrawing its place", func() bool { return st.withdrawals.Load() == 1 })
	if inLine(t, dsn, "w") {
		t.Fatal("the replica stands in line with nobody waiting")
	}
}

// Shared seats moved to another handle on the same database (a reload that opens the storage
// anew closes the old one) keep what they hold: the seat held is renewed through the new handle
// past its lease, its call is not cut, its release frees it, and the next call takes one.
func TestSharedSeatsReboundToAnotherHandleKeepTheirSeats(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	dsn := pgtest.Database(t)
	old, next := openSeats(t, dsn, clock), openSeats(t, dsn, clock)
	s := newTestShared(old, clock, 10*time.Second)
	h, err := s.Take(context.Background(), time.Time{}, 3, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := s.Watch(context.Background(), h)
	defer stop()
	s.Rebind(next)
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	// Three leases of renewals, each through the open handle (every second, 8 s before the cut).
	end := clock.Now().Add(30 * time.Second)
	testkit.WaitFor(t, time.Minute, "three leases passed", func() bool {
		if ctx.Err() != nil || !clock.Now().Before(end) {
			return true
		}
		clock.Advance(500 * time.Millisecond)
		return false
	})
	if ctx.Err() != nil {
		t.Fatalf("the call holding a seat was cut after the rebind: %v", context.Cause(ctx))
	}
	if until := locked(s, func() time.Time { return h.until }); !until.After(clock.Now()) {
		t.Fatalf("the seat's lease ends %v, before now: not renewed", until)
	}
	s.Give(h)
	testkit.WaitFor(t, 10*time.Second, "the seat released", func() bool {
		n, err := next.SeatsHeld("test")
		return err == nil && n == 0
	})
	h2, err := s.Take(context.Background(), time.Time{}, 3, "k", 1)
	if err != nil {
		t.Fatalf("a seat after the rebind: %v", err)
	}
	s.Give(h2)
}

// hangingSeats is a real store whose looks for a seat hang until the test ends, as a database
// that stops answering without failing.
type hangingSeats struct {
	store.SharedSeats
	stuck chan struct{}
}

func (h *hangingSeats) AcquireSeat(pool, seat, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	<-h.stuck
	return false, store.ErrUnavailable
}

// A call whose wait for a shared seat ends while the storage has not answered the look begun
// for it fails as the storage failing does, slowLook after its wait, not when the look gives
// up (each look may take the query timeout, and a call may wait for two).
func TestSharedSeatLookThatHangsFailsTheCallAfterItsWait(t *testing.T) {
	clock := clockwork.NewRealClock()
	hang := &hangingSeats{SharedSeats: openSeats(t, pgtest.Database(t), clock), stuck: make(chan struct{})}
	t.Cleanup(func() { close(hang.stuck) })
	s := newTestShared(hang, clock, time.Minute)
	s.slow = slowLook // as the gateway's
	begun := time.Now()
	taken := make(chan error, 1)
	go func() {
		_, err := s.Take(context.Background(), begun.Add(100*time.Millisecond), 3, "k", 1)
		taken <- err
	}()
	err := testkit.Receive(t, taken, "the call's answer while its look hangs")
	took := time.Since(begun)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a call whose look hangs got %v; want the storage unavailable", err)
	}
	t.Logf("failed after %v (wait 100ms, slowLook %v)", took.Round(time.Millisecond), s.slow)
}

// Each replica shows the fleet's calls waiting for a shared seat, by urgency, as the places in
// the fleet's line counted them, its own included: mulligan_capacity_shared_fleet_waiting and
// /mulligan/stats (capacity.shared.fleet_waiting_by_urgency).
func TestSharedSeatsShowTheFleetsWaiters(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	dsn := pgtest.Database(t)
	stA, stB := openSeats(t, dsn, clock), openSeats(t, dsn, clock)
	heldByOther(t, stA)
	a, b := newReplicaShared(stA, clock, time.Minute, "a"), newReplicaShared(stB, clock, time.Minute, "b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, c := range []struct {
		s       *Shared
		urgency int
	}{{a, 3}, {a, 3}, {a, 7}, {b, 5}} {
		go func() { _, _ = c.s.Take(ctx, time.Time{}, c.urgency, "k", 1) }()
	}
	want := [8]int{3: 2, 5: 1, 7: 1}
	pollUntil(t, clock, "the fleet's waiters counted on both replicas", func() bool {
		fa, fb := a.Snapshot().FleetWaiting, b.Snapshot().FleetWaiting
		return fa != nil && fb != nil && *fa == want && *fb == want
	})
	if w := a.Snapshot().Waiting; w != [8]int{3: 2, 7: 1} {
		t.Fatalf("replica a's own waiters %v", w)
	}
}

// The fleet's line shares the shared seats' slot time between keys, seats handed over
// included: on one seat, replica a's callers of a key of 300 ms calls and replica b's of a key
// of 75 ms calls, two each, hand the seat over as they give it back (store.SeatHandover), and
// the two keys hold it about as long as each other. With turns that count seats, the long
// calls held it about four times as long. On the real clock, as the fleet's turns are kept.
func TestSharedSeatsShareSlotTimeAcrossHandovers(t *testing.T) {
	clock := clockwork.NewRealClock()
	dsn := pgtest.Database(t)
	a := newReplicaShared(openSeats(t, dsn, clock), clock, time.Minute, "a")
	b := newReplicaShared(openSeats(t, dsn, clock), clock, time.Minute, "b")
	ctx, stop := context.WithTimeout(context.Background(), 4*time.Second)
	defer stop()
	var held [2]atomic.Int64 // nanoseconds each key held the seat
	var callers sync.WaitGroup
	for i, c := range []struct {
		s    *Shared
		key  string
		hold time.Duration
	}{{a, "key:long", 300 * time.Millisecond}, {b, "key:short", 75 * time.Millisecond}} {
		for range 2 {
			callers.Go(func() {
				for {
					h, err := c.s.Take(ctx, time.Time{}, 3, c.key, 1)
					if err != nil {
						return
					}
					began := time.Now()
					select {
					case <-time.After(c.hold):
					case <-ctx.Done():
					}
					held[i].Add(int64(time.Since(began)))
					c.s.Give(h)
				}
			})
		}
	}
	callers.Wait()
	long, short := time.Duration(held[0].Load()), time.Duration(held[1].Load())
	t.Logf("slot time: long calls %v, short calls %v", long, short)
	// The database counts a call's commits and round trips too, which the test does not: on a
	// loaded machine the short calls' key is charged more than it measures. 4 when keys take
	// turns.
	if ratio := float64(long) / float64(short); ratio > 2 || ratio < 1/2.0 {
		t.Fatalf("the long calls' key held the seat %.1f times as long as the short calls'; want about as long", ratio)
	}
}

// A key that comes back after its turn fell behind stands at its band's virtual time on its
// replica too, as the fleet's line stands it: on one replica, key a's turn in slot time is 9
// minutes back (it was idle), key b's at the band's virtual time, and b's first call came
// before a's; each call holds its seat 100 ms. Both keys stand at the virtual time, so b's call
// goes first, having come first, then a's (b's turn has moved on by its call's time); the
// second calls then stand at about the same turn. Ordered by the raw turns the replica read,
// a's call went first, though it came later.
func TestSharedSeatKeyBackFromIdleStandsAtTheVirtualTimeHere(t *testing.T) {
	clock := clockwork.NewRealClock()
	dsn := pgtest.Database(t)
	st := openSeats(t, dsn, clock)
	s := newTestShared(st, clock, time.Minute)
	heldByOther(t, st)
	pgtest.Count(t, dsn, `WITH turns AS (INSERT INTO seat_turns (pool, key, turn, vturn, hold, seen) VALUES
		('test', 'key:a', clock_timestamp(), clock_timestamp() - interval '9 minutes', 100000, clock_timestamp()),
		('test', 'key:b', clock_timestamp(), clock_timestamp() - interval '1 second', 100000, clock_timestamp()),
		('test', '*vtime:3', clock_timestamp(), clock_timestamp() - interval '1 second', NULL, clock_timestamp()),
		('test', '*average', clock_timestamp(), clock_timestamp(), 100000, clock_timestamp()) RETURNING 1)
		SELECT count(*) FROM turns`)
	served := make(chan string, 4)
	for i, key := range []string{"key:b", "key:a", "key:b", "key:a"} {
		name := key + "-" + strconv.Itoa(i/2+1)
		go func() {
			h, err := s.Take(context.Background(), time.Time{}, 3, key, 1)
			if err != nil {
				t.Error(err)
				served <- name
				return
			}
			served <- name
			time.Sleep(100 * time.Millisecond)
			s.Give(h)
		}()
		testkit.WaitFor(t, 10*time.Second, name+" waiting", func() bool { return s.waiters() == i+1 })
	}
	if err := st.ReleaseSeat("test", "other"); err != nil {
		t.Fatal(err)
	}
	var order []string
	for range 4 {
		order = append(order, testkit.Receive(t, served, "a call served"))
	}
	if want := []string{"key:b-1", "key:a-1"}; !slices.Equal(order[:2], want) {
		t.Fatalf("served %v; want %v first", order, want)
	}
}

package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
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

// Clearing away lapsed places in line and lapsed seats never waits for a row another
// transaction holds: while one (the sweep, or another replica's look) has locked a lapsed row
// and goes on to the next, a replica's look for a seat still answers, and the sweep too. Before,
// both deleted every lapsed row they saw, each in its own order, and two of them could each hold
// the row the other wanted next: PostgreSQL broke the deadlock by failing one, and the call
// waiting for a seat was answered 503.
func TestClearingLapsedRowsNeverWaitsForAnotherTransaction(t *testing.T) {
	reps := replicas(t, 1, storetest.NewClock())
	s := reps[0]
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `INSERT INTO seat_waiters (pool, worker, urgency, seat_limit, since, until) VALUES
		('model', 'gone-a', 3, 1, now() - interval '1 hour', now() - interval '1 minute'),
		('model', 'gone-b', 3, 1, now() - interval '1 hour', now() - interval '1 minute');
		INSERT INTO seats (pool, seat, worker, until) VALUES ('model', 'lapsed', 'gone-a', now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	holder, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	// Another transaction midway through clearing: it holds one lapsed place and the lapsed seat.
	if _, err := holder.Exec(ctx, `DELETE FROM seat_waiters WHERE worker = 'gone-a';
		DELETE FROM seats WHERE seat = 'lapsed'`); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 2)
	go func() {
		ok, err := s.AcquireSeat("model", "mine", "me", 1, time.Minute, store.SeatWaiter{Urgency: 3})
		if err == nil && !ok {
			err = errors.New("no seat, with none live")
		}
		answered <- err
	}()
	go func() {
		answered <- s.do(func(ctx context.Context, tx pgx.Tx) error {
			_, _, err := sweepCapacity(ctx, tx, time.Now())
			return err
		})
	}()
	for range 2 {
		if err := testkit.Receive(t, answered, "a look for a seat and the sweep, while another transaction holds lapsed rows"); err != nil {
			t.Fatal(err)
		}
	}
}

// A seat taken notes the fleet's turn of its call's key, and for a key without one the
// newcomers' (on the database's clock, read back as how long ago); renewing a seat already held
// moves neither; the sweep forgets a turn store.KeepIdleLanesFor after it was last written, but
// not while a live seat counts in it: a call held longer kept its key's turn.
func TestSeatTurnsAreTheFleetsAndForgottenByTheSweep(t *testing.T) {
	reps := replicas(t, 2, storetest.NewClock())
	a, b := reps[0], reps[1]
	if ok, err := a.AcquireSeat("model", "s1", "A", 2, time.Minute, store.SeatWaiter{Urgency: 3, Key: "key:acme"}); !ok || err != nil {
		t.Fatalf("first seat: %v %v", ok, err)
	}
	ago, err := b.SeatTurnsAgo("model", []string{"key:acme", store.SeatNewcomers, "key:other"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ago) != 2 || ago["key:acme"] > time.Minute || ago[store.SeatNewcomers] > time.Minute {
		t.Fatalf("turns seen from the other replica: %v; want acme's and the newcomers', just taken", ago)
	}
	ctx := context.Background()
	age := func() {
		t.Helper()
		if _, err := a.pool.Exec(ctx, `UPDATE seat_turns SET turn = turn - interval '11 minutes', vturn = vturn - interval '11 minutes',
			seen = seen - interval '11 minutes' WHERE key = 'key:acme'`); err != nil {
			t.Fatal(err)
		}
	}
	sweep := func() {
		t.Helper()
		if err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
			_, _, err := sweepCapacity(ctx, tx, time.Now())
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	age()
	if ok, err := a.AcquireSeat("model", "s1", "A", 2, time.Minute, store.SeatWaiter{Urgency: 3, Key: "key:acme"}); !ok || err != nil {
		t.Fatalf("renewal: %v %v", ok, err)
	}
	if ago, _ := b.SeatTurnsAgo("model", []string{"key:acme"}); ago["key:acme"] < 10*time.Minute {
		t.Fatalf("a renewal moved acme's turn: %v ago", ago["key:acme"])
	}
	sweep()
	if ago, _ := b.SeatTurnsAgo("model", []string{"key:acme", store.SeatNewcomers}); len(ago) != 2 {
		t.Fatalf("after the sweep, acme's seat live: %v; want acme's turn and the newcomers'", ago)
	}
	if err := a.ReleaseSeat("model", "s1"); err != nil {
		t.Fatal(err)
	}
	age()
	sweep()
	if ago, _ := b.SeatTurnsAgo("model", []string{"key:acme", store.SeatNewcomers}); len(ago) != 1 {
		t.Fatalf("after the sweep, acme's seat released: %v; want the newcomers' turn only", ago)
	}
}

// A look given up on does nothing after: another session holds the pool's lock past the look's
// call timeout (1s), and PostgreSQL aborts the look at its lock_timeout (half the call's) before
// the replica stops waiting. Before, the replica was answered an error at its timeout, and the
// look, waiting on for the lock, was canceled only by the cancel request pgx sends when the
// call's context ends: when the lock came free first, the look took the seat and committed (3
// runs in 10), a seat, or a place in the line, that the replica counted as not taken.
func TestALookGivenUpOnDoesNothingAfter(t *testing.T) {
	dsn := pgtest.Database(t)
	st, other := openTest(t, dsn, Options{Timeout: time.Second}), openTest(t, dsn, Options{})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, seatLockClass, "model"); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.AcquireSeat("model", "given-up", "A", 1, time.Minute, store.SeatWaiter{}); err == nil {
		t.Fatalf("a look answered %v while the pool's lock was held past its timeout", ok)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Any look still waiting for the lock gets it before this one, which waits behind it.
	if _, err := other.AcquireSeat("model", "after", "B", 2, time.Minute, store.SeatWaiter{}); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, dsn, `SELECT count(*) FROM seats WHERE pool = 'model' AND seat = 'given-up'`); n != 0 {
		t.Fatal("the look given up on took its seat once the lock was free")
	}
}

// A look that only stands its call in line again (every seat held, its replica's place in line
// standing) does not wait for the pool's lock: behind the looks that may take a seat, such
// looks (a poll while the seats are held, the replicas a freed seat's notice woke whose calls
// are not first) held back the one that would take it. A look of a replica without a place yet
// stands it under the lock (a release tells the replicas of a freed seat only when a place
// stands in line). Before, each waited for it. Without the lock, a look writes its own place
// and nothing else.
func TestALookThatOnlyStandsInLineLeavesThePoolsLockAlone(t *testing.T) {
	dsn := pgtest.Database(t)
	var reps []*Store
	for range 3 { // a lock timeout (half the call's) well past any stall of a loaded machine
		reps = append(reps, openTest(t, dsn, Options{Timeout: 20 * time.Second}))
	}
	a, b, c := reps[0], reps[1], reps[2]
	ctx := context.Background()
	if ok, err := a.AcquireSeat("model", "h", "A", 1, time.Minute, store.SeatWaiter{Urgency: 3}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := b.AcquireSeat("model", "b1", "B", 1, time.Minute, store.SeatWaiter{Urgency: 3}); ok || err != nil {
		t.Fatal("B's first look:", ok, err)
	}
	// B's place stands as if its replica kept looking, however slow the machine.
	if _, err := b.pool.Exec(ctx, `UPDATE seat_waiters SET until = clock_timestamp() + interval '1 minute' WHERE worker = 'B'`); err != nil {
		t.Fatal(err)
	}
	lock := holdPoolLock(t, a)
	look := func(st *Store, seat, worker string, urgency int) chan error {
		done := make(chan error, 1)
		go func() {
			ok, err := st.AcquireSeat("model", seat, worker, 1, time.Minute, store.SeatWaiter{Urgency: urgency, Waited: time.Second})
			if err == nil && ok {
				err = errors.New("took a seat")
			}
			done <- err
		}()
		return done
	}
	// A lapsed place and a lapsed seat of a replica gone.
	if _, err := b.pool.Exec(ctx, `INSERT INTO seat_waiters (pool, worker, urgency, seat_limit, since, until)
		VALUES ('model', 'X', 3, 1, clock_timestamp(), clock_timestamp() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO seats (pool, seat, worker, until) VALUES ('model', 'x', 'X', clock_timestamp() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	// The one seat is held: B's look stands its new call, lock or not.
	if err := testkit.Receive(t, look(b, "b2", "B", 1), "B's look while the pool's lock is held"); err != nil {
		t.Fatal(err)
	}
	// It wrote its own place and nothing else: clearing X's lapsed rows, it would hold them
	// while it waited for its own place, which a look under the lock that cleared B's lapsed
	// place would hold while it waited for X's.
	if n := count(t, b, `SELECT count(*) FROM seat_waiters WHERE worker = 'X'`) + count(t, b, `SELECT count(*) FROM seats WHERE worker = 'X'`); n != 2 {
		t.Fatalf("the look without the lock cleared %d lapsed rows of another replica", 2-n)
	}
	var urgency int
	if err := b.pool.QueryRow(ctx, `SELECT urgency FROM seat_waiters WHERE pool = 'model' AND worker = 'B'`).Scan(&urgency); err != nil || urgency != 1 {
		t.Fatalf("B's place after its look without the lock: urgency %d (%v), want its new call's 1", urgency, err)
	}
	// C has no place yet: its look waits for the lock.
	first := look(c, "c1", "C", 3)
	testkit.WaitFor(t, 10*time.Second, "C's first look waiting for the pool's lock", func() bool {
		return count(t, a, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 1
	})
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := testkit.Receive(t, first, "C's first look"); err != nil {
		t.Fatal(err)
	}
}

// A look takes a seat only under the pool's lock (seatLocked), whatever else it decided: with a
// free seat and nobody in line, the look's statement run without the lock stands the call in
// line and takes nothing.
func TestALookTakesASeatOnlyUnderThePoolsLock(t *testing.T) {
	st := openTest(t, pgtest.Database(t), Options{})
	for _, locked := range []bool{false, true} {
		got := false
		err := st.do(func(ctx context.Context, tx pgx.Tx) error {
			for _, q := range []string{
				`SELECT set_config('` + lookAt + `', clock_timestamp()::text, true)`, setSeatsAt,
				`SELECT set_config('` + seatLocked + `', '` + fmt.Sprint(locked) + `', true)`,
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			w := store.SeatWaiter{Urgency: 3, Key: "k"}
			return tx.QueryRow(ctx, takeSeatSQL, "model", fmt.Sprint("seat-", locked), "A", 1, time.Minute.Microseconds(),
				lineUrgency(w), int64(0), waiterLease.Microseconds(), lineKey(w), false, handoverReorder.Microseconds(),
				lineWaiting(w), 1.0).Scan(&got)
		})
		if err != nil {
			t.Fatal(err)
		}
		if got != locked {
			t.Fatalf("a look with the pool's lock %v took the free seat: %v", locked, got)
		}
		if n := count(t, st, `SELECT count(*) FROM seats WHERE pool = 'model'`); n != map[bool]int{false: 0, true: 1}[locked] {
			t.Fatalf("with the pool's lock %v, %d seats held", locked, n)
		}
	}
}

// A handover keeps its seat for its own call when another replica's call in line is of the same
// key and urgency and came within handoverReorder sooner: the seat does not stand idle going to
// the other replica and back. A call of that key that came longer before, one more urgent, one
// of another key, and calls of no key go first as the line ranks them.
func TestAHandoverKeepsTheSeatAheadOfTheSameKeysCallThatCameJustSooner(t *testing.T) {
	reps := replicas(t, 2, storetest.NewClock())
	a, b := reps[0], reps[1]
	ctx := context.Background()
	// ageOfB is how long ago B's place in line came, on the database's clock.
	ageOfB := func() time.Duration {
		var us int64
		if err := b.pool.QueryRow(ctx, `SELECT floor(extract(epoch FROM clock_timestamp() - came) * 1000000)::bigint
			FROM seat_waiters WHERE pool = 'model' AND worker = 'B'`).Scan(&us); err != nil {
			t.Fatal(err)
		}
		return time.Duration(us) * time.Microsecond
	}
	n := 0
	// handover has A take a free seat for its call of key, B stand its call w in line, and A hand
	// the seat over to another call of key that came `later` after B's; it returns whether A's
	// call was served and how long reading B's age and the handover took (A's call counts as
	// coming that much later still). The pool is left empty.
	handover := func(key string, w store.SeatWaiter, later time.Duration) (bool, time.Duration) {
		t.Helper()
		n++
		held, next, bs := fmt.Sprint("h", n), fmt.Sprint("a", n), fmt.Sprint("b", n)
		if ok, err := a.AcquireSeat("model", held, "A", 1, time.Minute, store.SeatWaiter{Urgency: 3, Key: key}); !ok || err != nil {
			t.Fatalf("A took no free seat: %v %v", ok, err)
		}
		if ok, err := b.AcquireSeat("model", bs, "B", 1, time.Minute, w); ok || err != nil {
			t.Fatalf("B took a held seat: %v %v", ok, err)
		}
		start := time.Now()
		mine := store.SeatWaiter{Urgency: 3, Waited: ageOfB() - later, Key: key}
		served, err := a.HandOverSeat("model", held, next, "A", 1, time.Minute, mine)
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if live := count(t, a, `SELECT count(*) FROM seat_waiters WHERE pool = 'model' AND worker = 'B' AND until > clock_timestamp()`); live != 1 {
			t.Fatalf("B's place in line lapsed during the case (%d live): the case says nothing", live)
		}
		for _, seat := range []string{next, bs} {
			if err := a.ReleaseSeat("model", seat); err != nil {
				t.Fatal(err)
			}
		}
		for _, worker := range []string{"A", "B"} {
			if err := a.WithdrawWaiter("model", worker); err != nil {
				t.Fatal(err)
			}
		}
		return served, took
	}
	// Within the window: A's call counts as coming 1 ms later plus the time the step took,
	// which is retried while it took more than 10 ms (a loaded machine), so the window holds it.
	for try := 0; ; try++ {
		served, took := handover("k", store.SeatWaiter{Urgency: 3, Waited: time.Second, Key: "k"}, time.Millisecond)
		if took > 10*time.Millisecond && try < 20 {
			continue
		}
		if !served {
			t.Fatalf("A's handover gave the seat to B's call of its key that came %v sooner", time.Millisecond+took)
		}
		break
	}
	// Another key, which took its last seat before k did: it goes first by its turn, however
	// close the two calls came.
	if ok, err := b.AcquireSeat("model", "j", "B", 1, time.Minute, store.SeatWaiter{Urgency: 3, Key: "j"}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := b.ReleaseSeat("model", "j"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		key   string
		b     store.SeatWaiter
		later time.Duration
	}{
		{"the same key, 200ms sooner", "k", store.SeatWaiter{Urgency: 3, Waited: time.Second, Key: "k"}, 200 * time.Millisecond},
		{"the same key, more urgent, 1ms sooner", "k", store.SeatWaiter{Urgency: 2, Waited: time.Second, Key: "k"}, time.Millisecond},
		{"another key whose turn came first, 1ms sooner", "k", store.SeatWaiter{Urgency: 3, Waited: time.Second, Key: "j"}, time.Millisecond},
		{"no key, 1ms sooner", "", store.SeatWaiter{Urgency: 3, Waited: time.Second}, time.Millisecond},
	} {
		if served, _ := handover(c.key, c.b, c.later); served {
			t.Fatalf("%s: A's handover kept the seat ahead of B's call", c.name)
		}
	}
}

// A look tells its call's wait as of when it began, not as of when it got the pool's lock
// (lookAt): a look that waited for the lock behind another replica's does not make its call
// look younger than it is in the fleet's line. Here the lock is held 300 ms while B's look of
// a call that has just come waits for it; its place came when the look began.
func TestALookTellsItsCallsWaitFromBeforeTheLock(t *testing.T) {
	reps := replicas(t, 2, storetest.NewClock())
	a, b := reps[0], reps[1]
	ctx := context.Background()
	if ok, err := a.AcquireSeat("model", "h", "A", 1, time.Minute, store.SeatWaiter{Urgency: 3}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	lock := holdPoolLock(t, a)
	var began time.Time
	if err := a.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&began); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.AcquireSeat("model", "b", "B", 1, time.Minute, store.SeatWaiter{Urgency: 3})
		done <- err
	}()
	testkit.WaitFor(t, 10*time.Second, "B's look waiting for the pool's lock", func() bool {
		return count(t, a, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 1
	})
	time.Sleep(300 * time.Millisecond) // the lock held while B's look waits
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := testkit.Receive(t, done, "B's look"); err != nil {
		t.Fatal(err)
	}
	var came time.Time
	if err := a.pool.QueryRow(ctx, `SELECT came FROM seat_waiters WHERE pool = 'model' AND worker = 'B'`).Scan(&came); err != nil {
		t.Fatal(err)
	}
	if d := came.Sub(began); d > 250*time.Millisecond {
		t.Fatalf("B's call came %v after its look began, the time it waited for the lock: it ranks younger than it is", d)
	}
}

// The fleet's waiters are counted from the places in its line: each keeps its replica's counts
// by urgency as of its latest look, a place that keeps none (a schema 16 binary's) counts as one
// call at its urgency, and a replica that took its seat, or whose place lapsed, counts none.
func TestLineCountsTheFleetsWaitersByUrgency(t *testing.T) {
	reps := replicas(t, 2, storetest.NewClock())
	a, b := reps[0], reps[1]
	if ok, err := a.AcquireSeat("model", "h", "holder", 1, time.Minute, store.SeatWaiter{}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	counted := store.SeatWaiter{Urgency: 3}
	counted.Waiting[3], counted.Waiting[7] = 2, 1
	if ok, err := a.AcquireSeat("model", "a", "A", 1, time.Minute, counted); ok || err != nil {
		t.Fatal("A", ok, err)
	}
	if ok, err := b.AcquireSeat("model", "b", "B", 1, time.Minute, store.SeatWaiter{Urgency: 5}); ok || err != nil {
		t.Fatal("B", ok, err)
	}
	got, err := a.SeatWaitersByUrgency("model")
	if err != nil {
		t.Fatal(err)
	}
	if want := [8]int{3: 2, 5: 1, 7: 1}; got != want {
		t.Fatalf("the fleet's waiters by urgency: %v; want %v", got, want)
	}
	if err := a.ReleaseSeat("model", "h"); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.AcquireSeat("model", "a", "A", 1, time.Minute, counted); !ok || err != nil {
		t.Fatal("A after the release", ok, err)
	}
	if got, err := b.SeatWaitersByUrgency("model"); err != nil || got != [8]int{5: 1} {
		t.Fatalf("after A took the seat: %v %v; want B's one call at 5", got, err)
	}
}

// holdPoolLock begins a transaction on st that holds the lock of pool "model" until it ends
// (rolled back at the test's end at the latest).
func holdPoolLock(t *testing.T, st *Store) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := st.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext('model'))`, seatLockClass); err != nil {
		t.Fatal(err)
	}
	return tx
}

package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

// oldLook is a schema 15 binary's AcquireSeat: no key, the line ordered by (urgency, since,
// worker).
func oldLook(t *testing.T, s *Store, pool, seat, worker string, limit int, w store.SeatWaiter) bool {
	got := false
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		got = false
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, seatLockClass, pool); err != nil {
			return err
		}
		var held int
		if err := tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE seat <> $2) FROM seats WHERE pool = $1 AND `+seatLive, pool, seat).Scan(&held); err != nil {
			return err
		}
		if held >= limit {
			_, err := tx.Exec(ctx, `INSERT INTO seat_waiters (pool, worker, urgency, seat_limit, since, until)
				VALUES ($1, $2, $3, $4, clock_timestamp() - $5 * interval '1 microsecond', `+leaseEnd(6)+`)
				ON CONFLICT (pool, worker) DO UPDATE SET urgency = EXCLUDED.urgency, seat_limit = EXCLUDED.seat_limit,
				since = EXCLUDED.since, until = EXCLUDED.until`,
				pool, worker, lineUrgency(w), limit, w.Waited.Microseconds(), waiterLease.Microseconds())
			return err
		}
		var ahead int
		if err := tx.QueryRow(ctx, `WITH me AS (
			INSERT INTO seat_waiters (pool, worker, urgency, seat_limit, since, until)
			VALUES ($1, $2, $3, $4, clock_timestamp() - $5 * interval '1 microsecond', `+leaseEnd(6)+`)
			ON CONFLICT (pool, worker) DO UPDATE SET urgency = EXCLUDED.urgency, seat_limit = EXCLUDED.seat_limit,
				since = EXCLUDED.since, until = EXCLUDED.until
			RETURNING urgency, since, worker)
		SELECT count(*) FROM seat_waiters a, me
		WHERE a.pool = $1 AND a.worker <> $2 AND a.seat_limit > $7 AND a.`+waiterLive+`
		AND (a.urgency, a.since, a.worker) < (me.urgency, me.since, me.worker)`,
			pool, worker, lineUrgency(w), limit, w.Waited.Microseconds(), waiterLease.Microseconds(), held).Scan(&ahead); err != nil {
			return err
		}
		if ahead >= limit-held {
			return nil
		}
		got = true
		_, err := tx.Exec(ctx, `INSERT INTO seats (pool, seat, worker, until) VALUES ($1, $2, $3, `+leaseEnd(4)+`)`, pool, seat, worker, time.Minute.Microseconds())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A replica of this release (N) and one of schema 15 (O) each stand a call in line for one of
// two shared seats; N's call (key k) came 5 s ago, but k took a seat just now; O's call has
// waited 3 s. Both rank O's call first, and O takes the seat that comes free. When N's place
// counted from when its call came, O ranked N's first (since 5 s ago) and N ranked O's first
// (k's turn is now): for 40 looks each, nobody took the free seat.
func TestAReplicaOfThePreviousSchemaAgreesOnTheLine(t *testing.T) {
	reps := replicas(t, 2, storetest.NewClock())
	n, o := reps[0], reps[1]
	if ok, err := n.AcquireSeat("model", "h", "H", 2, time.Minute, store.SeatWaiter{Urgency: 3}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := n.AcquireSeat("model", "k0", "N", 2, time.Minute, store.SeatWaiter{Urgency: 3, Key: "key:k"}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	lookN := func() bool {
		got, err := n.AcquireSeat("model", "n1", "N", 2, time.Minute, store.SeatWaiter{Urgency: 3, Waited: 5 * time.Second, Key: "key:k"})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	lookO := func() bool {
		return oldLook(t, o, "model", "o1", "O", 2, store.SeatWaiter{Urgency: 3, Waited: 3 * time.Second})
	}
	if lookN() || lookO() { // both seats held: both stand in line
		t.Fatal("took a held seat")
	}
	if err := n.ReleaseSeat("model", "h"); err != nil {
		t.Fatal(err)
	}
	if gotN := lookN(); gotN {
		t.Fatal("N took the seat O's call is due")
	}
	if !lookO() {
		t.Fatal("neither replica took the free seat: each ranks the other's call first")
	}
}

// schema19TakeSQL is a schema 19 binary's look statement (takeSeatSQL as release 3ce9097 sent
// it, written out), whose turns count seats: a place ranks from the later of its since and its
// key's turn as the row holds it, and a seat taken moves its key's turn to the clock.
const schema19TakeSQL = `WITH st AS (
		SELECT count(*) FILTER (WHERE seat <> $2) AS held, coalesce(bool_or(seat = $2), false) AS renewal
		FROM seats WHERE pool = $1 AND until > clock_timestamp()),
	me AS (SELECT $6::int AS urgency, greatest(current_setting('mulligan.look_at')::timestamptz - $7 * interval '1 microsecond', CASE WHEN $9::text IS NOT NULL THEN coalesce(
		(SELECT t.turn FROM seat_turns t WHERE t.pool = $1 AND t.key = $9::text),
		(SELECT t.turn FROM seat_turns t WHERE t.pool = $1 AND t.key = '*newcomers')) END) AS since, current_setting('mulligan.look_at')::timestamptz - $7 * interval '1 microsecond' AS came,
		$3::text AS worker, $9::text AS key),
	ahead AS (SELECT count(*) AS n FROM seat_waiters a, me, st
		WHERE a.pool = $1 AND a.worker <> $3 AND a.seat_limit > st.held AND a.until > clock_timestamp()
		AND (a.urgency, greatest(a.since, CASE WHEN a.key IS NOT NULL THEN coalesce(
		(SELECT t.turn FROM seat_turns t WHERE t.pool = $1 AND t.key = a.key),
		(SELECT t.turn FROM seat_turns t WHERE t.pool = $1 AND t.key = '*newcomers')) END), coalesce(a.came, a.since), a.worker) < (me.urgency, greatest(me.since, CASE WHEN me.key IS NOT NULL THEN coalesce(
		(SELECT t.turn FROM seat_turns t WHERE t.pool = $1 AND t.key = me.key),
		(SELECT t.turn FROM seat_turns t WHERE t.pool = $1 AND t.key = '*newcomers')) END), me.came, me.worker)
		AND NOT ($10::bool AND a.key = me.key AND a.urgency = me.urgency
			AND coalesce(a.came, a.since) > me.came - $11 * interval '1 microsecond') IS TRUE),
	d AS (SELECT st.held < $4 AND (st.renewal OR ahead.n < $4 - st.held) AS served, st.renewal FROM st, ahead),
	place AS (INSERT INTO seat_waiters (pool, worker, urgency, seat_limit, since, came, until, key, waiting)
		SELECT $1, $3, me.urgency, $4, me.since, me.came, clock_timestamp() + $8 * interval '1 microsecond', me.key, $12::int[] FROM me, d WHERE NOT d.served
	ON CONFLICT (pool, worker) DO UPDATE SET urgency = EXCLUDED.urgency, seat_limit = EXCLUDED.seat_limit,
		since = EXCLUDED.since, came = EXCLUDED.came, until = EXCLUDED.until, key = EXCLUDED.key,
		waiting = EXCLUDED.waiting),
	served AS (DELETE FROM seat_waiters WHERE pool = $1 AND worker = $3 AND (SELECT served AND NOT renewal FROM d)),
	taken AS (INSERT INTO seats (pool, seat, worker, until) SELECT $1, $2, $3, clock_timestamp() + $5 * interval '1 microsecond' FROM d WHERE d.served
		ON CONFLICT (pool, seat) DO UPDATE SET worker = $3, until = EXCLUDED.until),
	newcomers AS (INSERT INTO seat_turns (pool, key, turn) SELECT $1, '*newcomers', clock_timestamp() FROM d
		WHERE d.served AND NOT d.renewal AND $9::text IS NOT NULL AND $9::text <> '*newcomers'
		AND NOT EXISTS (SELECT 1 FROM seat_turns WHERE pool = $1 AND key = $9::text)
		ON CONFLICT (pool, key) DO UPDATE SET turn = EXCLUDED.turn),
	turn AS (INSERT INTO seat_turns (pool, key, turn) SELECT $1, $9::text, clock_timestamp() FROM d
		WHERE d.served AND NOT d.renewal AND $9::text IS NOT NULL
		ON CONFLICT (pool, key) DO UPDATE SET turn = EXCLUDED.turn)
	SELECT served FROM d, (SELECT set_config('synchronous_commit', CASE WHEN d.served OR $10::bool THEN current_setting('synchronous_commit') ELSE 'off' END, true) FROM d) sync`

// schema19Look is a schema 19 binary's AcquireSeat, one seat in pool "model".
func schema19Look(t *testing.T, s *Store, seat, worker string, w store.SeatWaiter) bool {
	t.Helper()
	got := false
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('`+lookAt+`', clock_timestamp()::text, true), pg_advisory_xact_lock($1, hashtext($2))`,
			seatLockClass, "model"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, schema19TakeSQL, "model", seat, worker, 1, time.Minute.Microseconds(), lineUrgency(w),
			w.Waited.Microseconds(), waiterLease.Microseconds(), lineKey(w), false, handoverReorder.Microseconds(), lineWaiting(w)).Scan(&got)
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// slotTurnsBehind sets the turns of pool "model" as they are under load: in slot time (vturn),
// each key's and band 3's virtual time the given seconds back; on the clock (turn, what a schema
// 19 binary reads), every key's 20 s back, older than any call of the tests came.
func slotTurnsBehind(t *testing.T, s *Store, vtime int, keys map[string]int) {
	t.Helper()
	rows := [][]any{{"*vtime:3", vtime}}
	for k, back := range keys {
		rows = append(rows, []any{k, back})
	}
	for _, r := range rows {
		if _, err := s.pool.Exec(context.Background(), `INSERT INTO seat_turns (pool, key, turn, vturn, seen)
			VALUES ('model', $1, clock_timestamp() - interval '20 seconds', clock_timestamp() - $2 * interval '1 second', clock_timestamp())
			ON CONFLICT (pool, key) DO UPDATE SET turn = EXCLUDED.turn, vturn = EXCLUDED.vturn, seen = EXCLUDED.seen`, r[0], r[1]); err != nil {
			t.Fatal(err)
		}
	}
}

// look is a look of this release for a call of key that came waited ago, one seat in pool
// "model".
func look(t *testing.T, s *Store, seat, worker, key string, waited time.Duration) bool {
	t.Helper()
	got, err := s.AcquireSeat("model", seat, worker, 1, time.Minute, store.SeatWaiter{Urgency: 3, Waited: waited, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A replica of this release (N) and one of schema 19 (O), whose turns count seats, each stand a
// call in line for the one shared seat. The turns in slot time lag the clock, as they do under
// load: N's key's a minute back, O's half a minute, the band's virtual time a minute and a
// half. O's call came 5 s ago, N's 1 s ago. O ranks by the later of when a call came and its
// key's turn on the clock: its own call first. So does N while a place of O's stands in line,
// and O takes the seat that comes free. Ranked by slot time, N's call (its key's turn the
// earlier) went first on N, and N took the seat O ranked as its own.
func TestAReplicaOfSchema19AgreesOnTheLine(t *testing.T) {
	reps := replicas(t, 2, storetest.NewClock())
	n, o := reps[0], reps[1]
	if ok, err := n.AcquireSeat("model", "h", "H", 1, time.Minute, store.SeatWaiter{Urgency: 3}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	slotTurnsBehind(t, n, 90, map[string]int{"key:n": 60, "key:o": 30})
	lookO := func() bool {
		return schema19Look(t, o, "o1", "O", store.SeatWaiter{Urgency: 3, Waited: 5 * time.Second, Key: "key:o"})
	}
	if look(t, n, "n1", "N", "key:n", time.Second) || lookO() { // the seat is held: both stand in line
		t.Fatal("took a held seat")
	}
	if err := n.ReleaseSeat("model", "h"); err != nil {
		t.Fatal(err)
	}
	if look(t, n, "n1", "N", "key:n", time.Second) {
		t.Fatal("N took the seat O's call is due by O's order")
	}
	if !lookO() {
		t.Fatal("neither replica took the free seat: each ranks the other's call first")
	}
}

// Two replicas of this release (N1, N2) and one of schema 19 (O) stand a call each in line for
// the one shared seat: N1's of key a came 0.1 s ago, N2's of key b 10 s ago, O's of key c 5 s
// ago; in slot time a's turn is an hour back, b's 50 minutes, the band's virtual time an hour
// and a half. O orders the calls b, c, a (by when they came: every key's turn on the clock is
// older). Compared by slot time among themselves (a before b) and as O compares them against
// O's, each replica counted one call ahead of its own, and nobody took the free seat. While a
// place of O's stands in line, this release compares every place as O does, and b's takes it.
func TestAFleetWithAReplicaOfSchema19KeepsOneOrder(t *testing.T) {
	reps := replicas(t, 3, storetest.NewClock())
	n1, n2, o := reps[0], reps[1], reps[2]
	if ok, err := n1.AcquireSeat("model", "h", "H", 1, time.Minute, store.SeatWaiter{Urgency: 3}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	slotTurnsBehind(t, n1, 5400, map[string]int{"key:a": 3600, "key:b": 3000, "key:c": 0})
	lookO := func() bool {
		return schema19Look(t, o, "o1", "O", store.SeatWaiter{Urgency: 3, Waited: 5 * time.Second, Key: "key:c"})
	}
	lookN1 := func() bool { return look(t, n1, "a1", "N1", "key:a", 100*time.Millisecond) }
	lookN2 := func() bool { return look(t, n2, "b1", "N2", "key:b", 10*time.Second) }
	if lookN1() || lookN2() || lookO() { // the seat is held: all stand in line
		t.Fatal("took a held seat")
	}
	if err := n1.ReleaseSeat("model", "h"); err != nil {
		t.Fatal(err)
	}
	if lookN1() || lookO() {
		t.Fatal("a's or c's call took the seat b's is due by O's order")
	}
	if !lookN2() {
		t.Fatal("nobody took the free seat: each replica ranks another's call ahead of its own")
	}
}

// A seat this release takes moves its key's turn on the clock to the take, as a schema 19
// replica reads and sweeps it (seat_turns.turn), whatever its turn in slot time: here an hour
// back, as under load. Written with the turn in slot time, a schema 19 sweep forgot the rows of
// keys in use, and its line ranked this release's calls by when they came only.
func TestATakeKeepsTheClockTurnASchema19ReplicaReads(t *testing.T) {
	reps := replicas(t, 1, storetest.NewClock())
	n := reps[0]
	slotTurnsBehind(t, n, 5400, map[string]int{"key:n": 3600})
	if !look(t, n, "n1", "N", "key:n", 0) {
		t.Fatal("no seat, with none held")
	}
	var ago, behind time.Duration
	if err := n.pool.QueryRow(context.Background(), `SELECT clock_timestamp() - turn, clock_timestamp() - vturn FROM seat_turns
		WHERE pool = 'model' AND key = 'key:n'`).Scan(&ago, &behind); err != nil {
		t.Fatal(err)
	}
	if ago > 5*time.Second || behind < 50*time.Minute {
		t.Fatalf("after the take, the clock turn is %v back and the turn in slot time %v; want now and about an hour", ago, behind)
	}
}

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

// schema19TakeSQL is a schema 19 binary's look statement (its takeSeatSQL), whose turns count
// seats: a place ranks from the later of its since and its key's turn as the row holds it, and
// a seat taken moves its key's turn to the clock.
var schema19TakeSQL = `WITH st AS (
		SELECT count(*) FILTER (WHERE seat <> $2) AS held, coalesce(bool_or(seat = $2), false) AS renewal
		FROM seats WHERE pool = $1 AND ` + seatLive + `),
	me AS (SELECT $6::int AS urgency, ` + placeSinceSQL("$7", "$9") + ` AS since, ` + cameSQL("$7") + ` AS came,
		$3::text AS worker, $9::text AS key),
	ahead AS (SELECT count(*) AS n FROM seat_waiters a, me, st
		WHERE a.pool = $1 AND a.worker <> $3 AND a.seat_limit > st.held AND a.` + waiterLive + `
		AND (a.urgency, ` + oldLineTurnSQL("a") + `, coalesce(a.came, a.since), a.worker) < (me.urgency, ` + oldLineTurnSQL("me") + `, me.came, me.worker)),
	d AS (SELECT st.held < $4 AND (st.renewal OR ahead.n < $4 - st.held) AS served, st.renewal FROM st, ahead),
	place AS (INSERT INTO seat_waiters (pool, worker, urgency, seat_limit, since, came, until, key)
		SELECT $1, $3, me.urgency, $4, me.since, me.came, ` + leaseEnd(8) + `, me.key FROM me, d WHERE NOT d.served
		ON CONFLICT (pool, worker) DO UPDATE SET urgency = EXCLUDED.urgency, seat_limit = EXCLUDED.seat_limit,
			since = EXCLUDED.since, came = EXCLUDED.came, until = EXCLUDED.until, key = EXCLUDED.key),
	served AS (DELETE FROM seat_waiters WHERE pool = $1 AND worker = $3 AND (SELECT served AND NOT renewal FROM d)),
	taken AS (INSERT INTO seats (pool, seat, worker, until) SELECT $1, $2, $3, ` + leaseEnd(5) + ` FROM d WHERE d.served
		ON CONFLICT (pool, seat) DO UPDATE SET worker = $3, until = EXCLUDED.until),
	turn AS (INSERT INTO seat_turns (pool, key, turn) SELECT $1, $9::text, clock_timestamp() FROM d
		WHERE d.served AND NOT d.renewal AND $9::text IS NOT NULL
		ON CONFLICT (pool, key) DO UPDATE SET turn = EXCLUDED.turn)
	SELECT served FROM d`

// schema19Look is a schema 19 binary's AcquireSeat (without its newcomers' turn, which the test
// does not reach).
func schema19Look(t *testing.T, s *Store, seat, worker string, w store.SeatWaiter) bool {
	t.Helper()
	got := false
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('`+lookAt+`', clock_timestamp()::text, true), pg_advisory_xact_lock($1, hashtext($2))`,
			seatLockClass, "model"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, schema19TakeSQL, "model", seat, worker, 1, time.Minute.Microseconds(), lineUrgency(w),
			w.Waited.Microseconds(), waiterLease.Microseconds(), lineKey(w)).Scan(&got)
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A replica of this release (N) and one of schema 19 (O), whose turns count seats, each stand a
// call in line for the one shared seat. The turns in slot time lag the clock, as they do under
// load: N's key's turn is a minute back, O's half a minute, the band's virtual time a minute
// and a half. O's call came 5 s ago, N's 1 s ago. O ranks by the later of when a call came and
// its key's turn: its own call first. So does N, comparing a place of O's as O does, and O takes
// the seat that comes free. Ranked by slot time, N's call (its key's turn the earlier) went
// first on N, and N took the seat O ranked as its own.
func TestAReplicaOfSchema19AgreesOnTheLine(t *testing.T) {
	reps := replicas(t, 2, storetest.NewClock())
	n, o := reps[0], reps[1]
	if ok, err := n.AcquireSeat("model", "h", "H", 1, time.Minute, store.SeatWaiter{Urgency: 3}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := n.pool.Exec(context.Background(), `INSERT INTO seat_turns (pool, key, turn, seen) VALUES
		('model', 'key:n', clock_timestamp() - interval '60 seconds', clock_timestamp()),
		('model', 'key:o', clock_timestamp() - interval '30 seconds', clock_timestamp()),
		('model', '*vtime:3', clock_timestamp() - interval '90 seconds', clock_timestamp())
		ON CONFLICT (pool, key) DO UPDATE SET turn = EXCLUDED.turn, seen = EXCLUDED.seen`); err != nil {
		t.Fatal(err)
	}
	lookN := func() bool {
		got, err := n.AcquireSeat("model", "n1", "N", 1, time.Minute, store.SeatWaiter{Urgency: 3, Waited: time.Second, Key: "key:n"})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	lookO := func() bool {
		return schema19Look(t, o, "o1", "O", store.SeatWaiter{Urgency: 3, Waited: 5 * time.Second, Key: "key:o"})
	}
	if lookN() || lookO() { // the seat is held: both stand in line
		t.Fatal("took a held seat")
	}
	if err := n.ReleaseSeat("model", "h"); err != nil {
		t.Fatal(err)
	}
	if lookN() {
		t.Fatal("N took the seat O's call is due by O's order")
	}
	if !lookO() {
		t.Fatal("neither replica took the free seat: each ranks the other's call first")
	}
}

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

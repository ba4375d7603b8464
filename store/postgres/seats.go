package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
)

// Seats shared by the replicas on one database (capacity `shared N`, docs/backends.md): a seat is
// a row held by a worker until a time it renews; a replica that dies stops renewing, and its
// seats lapse and stop counting.

// seatLockClass is the first key of the two-key advisory lock that serializes acquisitions in one
// pool (hashtext(pool) is the second); two-key locks never collide with the one-key locks of
// migrations and the sweep.
const seatLockClass int32 = 0x6d756c6c

// The Store shares seats between replicas.
var _ store.SharedSeats = (*Store)(nil)

// AcquireSeat takes one of limit seats of pool for worker until `until`; false when limit live
// seats are held (see store.SharedSeats). Taking a seat already held renews it.
func (s *Store) AcquireSeat(pool, seat, worker string, limit int, until time.Time) (bool, error) {
	got := false
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		// Counting then inserting is a race between two replicas unless they take turns.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, seatLockClass, pool); err != nil {
			return err
		}
		now := s.now()
		if _, err := tx.Exec(ctx, `DELETE FROM seats WHERE pool = $1 AND until <= $2`, pool, now); err != nil {
			return err
		}
		var held int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM seats WHERE pool = $1 AND seat <> $2`, pool, seat).Scan(&held); err != nil {
			return err
		}
		if held >= limit {
			return nil
		}
		got = true
		_, err := tx.Exec(ctx, `INSERT INTO seats (pool, seat, worker, until) VALUES ($1, $2, $3, $4)
			ON CONFLICT (pool, seat) DO UPDATE SET worker = $3, until = $4`, pool, seat, worker, until)
		return err
	})
	return got, err
}

// SeatsHeld counts pool's live seats, held by any replica (see store.SharedSeats).
func (s *Store) SeatsHeld(pool string) (int, error) {
	var n int
	err := s.query(func(ctx context.Context, db querier) error {
		return db.QueryRow(ctx, `SELECT count(*) FROM seats WHERE pool = $1 AND until > $2`, pool, s.now()).Scan(&n)
	})
	return n, err
}

// ReleaseSeat gives seat of pool back (see store.SharedSeats).
func (s *Store) ReleaseSeat(pool, seat string) error {
	return s.query(func(ctx context.Context, db querier) error {
		_, err := db.Exec(ctx, `DELETE FROM seats WHERE pool = $1 AND seat = $2`, pool, seat)
		return err
	})
}

// RenewSeats extends those of seats that worker holds in pool and that are still live until
// `until`, and returns them (see store.SharedSeats). A seat that already lapsed is not revived:
// another replica may have taken its place.
func (s *Store) RenewSeats(pool, worker string, seats []string, until time.Time) ([]string, error) {
	var renewed []string
	err := s.query(func(ctx context.Context, db querier) error {
		rows, err := db.Query(ctx, `UPDATE seats SET until = $4 WHERE pool = $1 AND worker = $2 AND seat = ANY($3) AND until > $5
			RETURNING seat`, pool, worker, seats, until, s.now())
		if err != nil {
			return err
		}
		renewed, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return renewed, err
}

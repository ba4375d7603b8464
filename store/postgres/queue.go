package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
)

// ClaimNext takes the next queued operation in the capacity order that no other replica is
// taking (FOR UPDATE SKIP LOCKED), running, held by worker until now+lease (see store.Queue).
// The replica's claims take turns (Store.claiming).
func (s *Store) ClaimNext(worker string, lease time.Duration) (*store.Operation, error) {
	s.claiming.Lock()
	defer s.claiming.Unlock()
	var out *store.Operation
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		now := s.now()
		op, c, err := claimInOrder(ctx, tx, now)
		if err != nil || op == nil {
			return err
		}
		out, err = s.startClaimed(ctx, tx, op, c, worker, lease, now)
		return err
	})
	return out, err
}

// startClaimed writes op, claimed in tx, as running under worker's lease, with what its claim
// charged (c). Every claim waits for
// the WAL's flush, unlike Badger's under on_crash requeue (store.ClaimMustBeDurable):
// PostgreSQL can crash, or fail over, while the replica that claimed runs on, and a claim lost
// so would let another replica run the operation at the same time as the first.
func (s *Store) startClaimed(ctx context.Context, tx pgx.Tx, op *store.Operation, c claimCharge, worker string, lease time.Duration, now time.Time) (*store.Operation, error) {
	store.Apply(op, c.change(), now)
	op.Holder, op.LeaseUntil = worker, now.Add(lease)
	p := &pipeline{} // its row, with its run's charge, and its event in one round trip
	var run *claimCharge
	if c.charged > 0 {
		run = &c
	}
	if err := putOpRun(ctx, p, op, run); err != nil {
		return nil, err
	}
	if err := s.announce(ctx, p, op, nil); err != nil {
		return nil, err
	}
	if err := p.send(ctx, tx); err != nil {
		return nil, err
	}
	return op, nil
}

// RenewLeases extends worker's leases on ids in one statement; what it did not renew is lost
// (see store.Queue).
func (s *Store) RenewLeases(worker string, ids []string, lease time.Duration) (store.Renewal, error) {
	var out store.Renewal
	ids, out.Lost = storableIDs(ids) // ids no row can have are held by no one
	if len(ids) == 0 {
		return out, nil
	}
	err := s.query(func(ctx context.Context, db querier) error {
		rows, err := db.Query(ctx, `UPDATE operations SET lease_until = $3
			WHERE id = ANY($1) AND status = 'running' AND holder = $2
			RETURNING id, cancel_requested_at IS NOT NULL`, ids, worker, s.now().Add(lease))
		if err != nil {
			return err
		}
		defer rows.Close()
		held := map[string]bool{}
		for rows.Next() {
			var id string
			var cancel bool
			if err := rows.Scan(&id, &cancel); err != nil {
				return err
			}
			held[id] = true
			if cancel {
				out.CancelRequested = append(out.CancelRequested, id)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range ids {
			if !held[id] {
				out.Lost = append(out.Lost, id)
			}
		}
		return nil
	})
	return out, err
}

// ExpiredLeases returns up to limit running operations whose lease ran out, longest expired
// first (see store.Queue).
func (s *Store) ExpiredLeases(limit int) ([]*store.Operation, error) {
	if limit <= 0 {
		return nil, nil // PostgreSQL refuses a negative LIMIT
	}
	var out []*store.Operation
	err := s.query(func(ctx context.Context, db querier) error {
		rows, err := db.Query(ctx, `SELECT `+opColumns+` FROM operations WHERE status = 'running'
			AND (lease_until IS NULL OR lease_until <= $1) ORDER BY lease_until NULLS FIRST LIMIT $2`, s.now(), limit)
		if err != nil {
			return err
		}
		out, err = scanOps(rows)
		return err
	})
	return out, err
}

// ActiveCount counts scope's queued and running operations.
func (s *Store) ActiveCount(scope string) (int, error) {
	var n int
	err := s.query(func(ctx context.Context, db querier) error {
		return db.QueryRow(ctx, `SELECT count(*) FROM operations WHERE scope = $1 AND status IN ('queued', 'running')`, scope).Scan(&n)
	})
	return n, err
}

// QueueStats counts queued and running operations, batch lines left out (their ids are
// store.LineOperationID's).
func (s *Store) QueueStats() (queued, running int, err error) {
	err = s.query(func(ctx context.Context, db querier) error {
		return db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'running')
			FROM operations WHERE status IN ('queued', 'running') AND id NOT LIKE 'op\_batch\_%'`).Scan(&queued, &running)
	})
	return queued, running, err
}

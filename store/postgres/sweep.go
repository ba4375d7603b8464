package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// SweepStats counts what one sweep removed.
type SweepStats struct {
	Skipped     bool // another replica held the sweep lock
	Keys        int64
	Results     int64
	Operations  int64
	Delivered   int64
	DeadLetters int64
	// StreamSegments counts the stored batches of events of recorded streams past their keep
	// time.
	StreamSegments int64
	// Turns counts the scopes' turns forgotten (no queued or running work left); Seats the
	// shared seats that lapsed.
	Turns int64
	Seats int64
	// Files and Batches count files past their expiry (their chunks go with them) and
	// batches past their retention.
	Files   int64
	Batches int64
}

// sweepBatch bounds the rows one statement of a sweep deletes, so a backlog is worked off in
// short transactions over several sweeps instead of one long one.
//
// Each statement picks its rows in a subquery and checks the condition again on the row it
// deletes: a row rewritten meanwhile (a key claimed again, a dead letter redelivered) is waited
// for, and under READ COMMITTED only the outer condition is checked again on the new version,
// so without the repeat the sweep would delete a row that is no longer past its time.
const sweepBatch = 5000

// Sweep removes what is past its retention: idempotency records past their window, results
// and tombstones of expired operations, delivered events, dead letters older than
// DeadLetterRetention, recorded streams past their keep time. It runs on one replica at a time: a replica that cannot take the sweep
// lock skips its turn.
func (s *Store) Sweep() (SweepStats, error) {
	var st SweepStats
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		var got bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, lockSweep).Scan(&got); err != nil {
			return err
		}
		if !got {
			st.Skipped = true
			return nil
		}
		now := s.now()
		steps := []struct {
			n     *int64
			sql   string
			until time.Time
		}{
			{&st.Keys, `DELETE FROM idempotency_keys WHERE key IN (SELECT key FROM idempotency_keys WHERE purge_at <= $1 LIMIT $2)
				AND purge_at <= $1`, now},
			{&st.Results, `DELETE FROM operation_results WHERE op_id IN (SELECT op_id FROM operation_results WHERE expires_at <= $1 LIMIT $2)
				AND expires_at <= $1`, now},
			{&st.Operations, `DELETE FROM operations WHERE id IN (SELECT id FROM operations WHERE purge_at <= $1 LIMIT $2)
				AND purge_at <= $1`, now},
			{&st.Delivered, `DELETE FROM events WHERE id IN (SELECT id FROM events WHERE purge_at <= $1 LIMIT $2)
				AND purge_at <= $1`, now},
			{&st.DeadLetters, `DELETE FROM events WHERE id IN (SELECT id FROM events WHERE state = 'dead' AND dead_at <= $1 LIMIT $2)
				AND state = 'dead' AND dead_at <= $1`, now.Add(-s.opts.DeadLetterRetention)},
			{&st.StreamSegments, `WITH gone AS (DELETE FROM stream_heads WHERE key IN
					(SELECT key FROM stream_heads WHERE keep_until <= $1 LIMIT $2) AND keep_until <= $1 RETURNING key, token),
				ids AS (DELETE FROM stream_ids i USING gone WHERE i.key = gone.key AND i.token = gone.token)
				DELETE FROM stream_segments g USING gone WHERE g.key = gone.key AND g.token = gone.token`, now},
			{&st.Files, `DELETE FROM files WHERE id IN (SELECT id FROM files WHERE expires_at <= $1 LIMIT $2)
				AND expires_at <= $1`, now},
			{&st.Batches, `DELETE FROM batches WHERE id IN (SELECT id FROM batches WHERE purge_at <= $1 LIMIT $2)
				AND purge_at <= $1`, now},
		}
		for _, step := range steps {
			tag, err := tx.Exec(ctx, step.sql, step.until, sweepBatch)
			if err != nil {
				return err
			}
			*step.n = tag.RowsAffected()
		}
		var err error
		st.Turns, st.Seats, err = sweepCapacity(ctx, tx, now)
		return err
	})
	return st, err
}

// sweepEvery runs Sweep every interval until Close.
func (s *Store) sweepEvery(interval time.Duration) {
	defer s.bg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.base.Done():
			return
		case <-t.C:
			if _, err := s.Sweep(); err != nil {
				s.logf("postgres: retention sweep: %v", err)
			}
		}
	}
}

package postgres

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
)

// The Store records event streams, so a duplicate on any replica joins, resumes or replays a
// keyed stream (docs/streams.md).
var _ store.StreamRecorder = (*Store)(nil)

// relaxed turns off the wait for the WAL flush for the rest of tx: events are appended as
// they stream, and a partial recording is worth nothing after a crash (it is never replayed).
// FinishStream commits with the flush, and the WAL is flushed in order, so every event
// appended before it is durable when it returns.
func relaxed(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`)
	return err
}

// BeginStream implements store.StreamRecorder. The stream of a previous attempt under the same
// key is replaced and its events deleted. The claim's row is locked while the head is written,
// so an attempt whose claim is being taken over cannot start a stream over the new one's.
func (s *Store) BeginStream(key []byte, token string, status int, header http.Header, keep time.Duration) error {
	h, err := store.EncodeHeader(header)
	if err != nil {
		return err
	}
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		if err := relaxed(ctx, tx); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `WITH held AS (
				SELECT 1 FROM idempotency_keys WHERE key = $1 AND state = 1 AND token = $2 FOR SHARE)
			INSERT INTO stream_heads (key, token, state, status, header, keep_until)
			SELECT $1, $2, 1, $3, $4, $5 FROM held
			ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, state = 1, status = EXCLUDED.status,
				header = EXCLUDED.header, events = 0, bytes = 0, keep_until = EXCLUDED.keep_until`,
			key, token, status, h, s.now().Add(keep))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return domain{store.ErrNotHolder}
		}
		_, err = tx.Exec(ctx, `DELETE FROM stream_events WHERE key = $1 AND token <> $2`, key, token)
		return err
	})
}

// AppendEvents implements store.StreamRecorder in one statement, so one round trip: the head is
// advanced (fenced on the claim's token and a live stream) and the batch inserted, in the
// statement's own transaction, which does not wait for the WAL flush (set_config, local to
// that transaction: see relaxed).
func (s *Store) AppendEvents(key []byte, token string, events []store.StreamEvent) error {
	if len(events) == 0 {
		return nil
	}
	ids, data := make([][]byte, len(events)), make([][]byte, len(events))
	var size int64
	for i, e := range events {
		ids[i], data[i] = []byte(e.ID), e.Data
		size += int64(len(e.Data))
	}
	return s.query(func(ctx context.Context, db querier) error {
		tag, err := db.Exec(ctx, `WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)),
			head AS (UPDATE stream_heads SET events = events + $3, bytes = bytes + $4
				WHERE key = $1 AND token = $2 AND state = 1 RETURNING events - $3 AS last)
			INSERT INTO stream_events (key, token, seq, id, data)
			SELECT $1, $2, head.last + e.n, e.id, e.data
			FROM relaxed, head, unnest($5::bytea[], $6::bytea[]) WITH ORDINALITY AS e(id, data, n)`,
			key, token, len(events), size, ids, data)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return domain{store.ErrStreamNotLive}
		}
		return nil
	})
}

// ReadEvents implements store.StreamRecorder, in one statement (one snapshot): the head, whether
// its claim is still held, and a page of events. A live stream whose claim is gone or ran out
// of lease (its gateway died) reads as aborted.
func (s *Store) ReadEvents(key []byte, after uint64, limit int) (store.StreamPage, error) {
	var page store.StreamPage
	err := s.query(func(ctx context.Context, db querier) error {
		now := s.now()
		rows, err := db.Query(ctx, `SELECT h.token, h.state, h.status, h.header, h.events, h.bytes,
				coalesce(k.state = 1 AND k.token = h.token AND k.lease_until > $2, false), e.seq, e.id, e.data
			FROM stream_heads h
			LEFT JOIN idempotency_keys k ON k.key = h.key
			LEFT JOIN LATERAL (SELECT seq, id, data FROM stream_events
				WHERE key = h.key AND token = h.token AND seq > $3 ORDER BY seq LIMIT $4) e ON true
			WHERE h.key = $1 AND h.keep_until > $2
			ORDER BY e.seq`, key, now, int64(min(after, 1<<62)), max(limit, 0))
		if err != nil {
			return err
		}
		defer rows.Close()
		page = store.StreamPage{}
		for rows.Next() {
			var (
				state  int16
				status int32
				header []byte
				held   bool
				seq    *int64
				id     []byte
				data   []byte
			)
			if err := rows.Scan(&page.Token, &state, &status, &header, &page.Events, &page.Bytes, &held, &seq, &id, &data); err != nil {
				return err
			}
			if page.Status == 0 {
				page.State, page.Status = store.StreamState(state), int(status)
				if page.Header, err = store.DecodeHeader(header); err != nil {
					return err
				}
				if page.State == store.StreamLive && !held {
					page.State = store.StreamAborted
				}
			}
			if seq != nil {
				page.List = append(page.List, store.StreamEvent{Seq: uint64(*seq), ID: string(id), Data: nonNil(data)})
			}
		}
		return rows.Err()
	})
	return page, err
}

// FindEvent implements store.StreamRecorder: every event's id is indexed, so an upstream's id
// is found by the index; a gateway-assigned id is also the event's position.
func (s *Store) FindEvent(key []byte, id string) (uint64, bool, error) {
	var seq int64
	var found bool
	err := s.query(func(ctx context.Context, db querier) error {
		var events int64
		err := db.QueryRow(ctx, `SELECT h.events, coalesce((SELECT min(seq) FROM stream_events e
				WHERE e.key = h.key AND e.token = h.token AND e.id = $3), 0)
			FROM stream_heads h WHERE h.key = $1 AND h.keep_until > $2`, key, s.now(), []byte(id)).Scan(&events, &seq)
		switch {
		case err == pgx.ErrNoRows:
			return nil
		case err != nil:
			return err
		case seq > 0:
			found = true
		default:
			if n, perr := strconv.ParseInt(id, 10, 64); perr == nil && n >= 1 && n <= events {
				seq, found = n, true
			}
		}
		return nil
	})
	return uint64(seq), found, err
}

// FinishStream implements store.StreamRecorder: the stream is marked whole and the key
// completed with its status and headers in one transaction, which waits for the WAL flush.
func (s *Store) FinishStream(key []byte, token string, expires time.Time) error {
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		var (
			status int32
			header []byte
			keep   time.Time
		)
		err := tx.QueryRow(ctx, `UPDATE stream_heads SET state = 2 WHERE key = $1 AND token = $2 AND state = 1
			RETURNING status, header, keep_until`, key, token).Scan(&status, &header, &keep)
		if err == pgx.ErrNoRows {
			return domain{store.ErrStreamNotLive}
		}
		if err != nil {
			return err
		}
		if expires.After(keep) {
			expires = keep // the events go at keep_until: the record must not outlive them
		}
		tag, err := tx.Exec(ctx, `UPDATE idempotency_keys SET rev = rev + 1, state = 2, token = '', lease_until = NULL,
			expires_at = $3, purge_at = $3, operation_id = NULL, response_status = $4, response_header = $5,
			response_body = '', streamed_rev = rev + 1 WHERE key = $1 AND state = 1 AND token = $2`, key, token, expires, status, header)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return domain{store.ErrNotHolder}
		}
		return nil
	})
}

// DropStream implements store.StreamRecorder: the stream is marked aborted and its events
// deleted, in one transaction; the claim stays.
func (s *Store) DropStream(key []byte, token string) error {
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE stream_heads SET state = 3 WHERE key = $1 AND token = $2 AND state = 1`, key, token)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return domain{store.ErrStreamNotLive}
		}
		_, err = tx.Exec(ctx, `DELETE FROM stream_events WHERE key = $1 AND token = $2`, key, token)
		return err
	})
}

// AbortStream implements store.StreamRecorder: the stream is marked aborted, its events
// deleted and the key released, in one transaction.
func (s *Store) AbortStream(key []byte, token string) error {
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE stream_heads SET state = 3 WHERE key = $1 AND token = $2`, key, token); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM stream_events WHERE key = $1 AND token = $2`, key, token); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE key = $1 AND state = 1 AND token = $2`, key, token)
		return err
	})
}

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
// keyed stream (docs/streams.md). A batch of events is one row of stream_segments (as on
// Badger, one write per batch), with the upstream's own event ids in stream_ids.
var _ store.StreamRecorder = (*Store)(nil)

// relaxed turns off the wait for the WAL flush for the rest of tx: events are appended as
// they stream, and a partial recording is worth nothing after a crash (it is never replayed).
// FinishStream commits with the flush, and the WAL is flushed in order, so every event
// appended before it is durable when it returns.
func relaxed(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`)
	return err
}

// dropAttempts deletes the segments and ids of key's streams: of every attempt but keep's when
// keep is set (`<>`), else of attempt token (`=`).
func dropAttempts(ctx context.Context, tx pgx.Tx, key []byte, op, token string) error {
	for _, table := range []string{"stream_segments", "stream_ids"} {
		if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE key = $1 AND token `+op+` $2`, key, token); err != nil {
			return err
		}
	}
	return nil
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
		return dropAttempts(ctx, tx, key, "<>", token)
	})
}

// AppendEvents implements store.StreamRecorder in one statement, so one round trip: the head is
// advanced (fenced on the claim's token and a live stream), the batch stored as one segment and
// the upstream's own ids indexed, in the statement's own transaction, which does not wait for
// the WAL flush (set_config, local to that transaction: see relaxed). An id the stream repeats,
// in this batch or an earlier one, is ambiguous and indexed at position 0, which FindEvent
// never finds (docs/streams.md).
func (s *Store) AppendEvents(key []byte, token string, events []store.StreamEvent) error {
	if len(events) == 0 {
		return nil
	}
	var size int64
	var ids [][]byte
	var at []int64 // the position of each of ids in the batch, from 1
	for i, e := range events {
		size += int64(len(e.Data))
		if e.ID != "" {
			ids, at = append(ids, []byte(e.ID)), append(at, int64(i+1))
		}
	}
	segment := store.EncodeSegment(nil, events)
	return s.query(func(ctx context.Context, db querier) error {
		var appended int
		err := db.QueryRow(ctx, `WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)),
			head AS (UPDATE stream_heads SET events = events + $3, bytes = bytes + $4
				WHERE key = $1 AND token = $2 AND state = 1 RETURNING events - $3 AS last),
			seg AS (INSERT INTO stream_segments (key, token, first_seq, last_seq, data)
				SELECT $1, $2, head.last + 1, head.last + $3, $5 FROM relaxed, head RETURNING first_seq),
			ids AS (INSERT INTO stream_ids (key, token, id, seq)
				SELECT $1, $2, i.id, CASE WHEN count(*) > 1 THEN 0 ELSE min(seg.first_seq + i.at - 1) END
				FROM seg, unnest($6::bytea[], $7::bigint[]) AS i(id, at)
				WHERE i.id <> convert_to((seg.first_seq + i.at - 1)::text, 'UTF8')
				GROUP BY i.id
				ON CONFLICT (key, token, id) DO UPDATE SET seq = 0)
			SELECT count(*) FROM seg`,
			key, token, len(events), size, segment, ids, at).Scan(&appended)
		if err != nil {
			return err
		}
		if appended == 0 {
			return domain{store.ErrStreamNotLive}
		}
		return nil
	})
}

// readEventsSQL reads a stream's head, whether its claim is still held, and the segments holding
// the events after $3, up to $4 of them. The first of those segments is found by the primary
// key, as the last one starting at or before event $3+1 (segments are contiguous), so a page
// deep in a long stream reads its own segments and not every one before it.
const readEventsSQL = `SELECT h.token, h.state, h.status, h.header, h.events, h.bytes,
		coalesce(k.state = 1 AND k.token = h.token AND k.lease_until > $2, false), g.first_seq, g.data
	FROM stream_heads h
	LEFT JOIN idempotency_keys k ON k.key = h.key
	LEFT JOIN LATERAL (SELECT first_seq, data FROM stream_segments
		WHERE key = h.key AND token = h.token AND $4 > 0 AND last_seq > $3 AND first_seq <= $3 + $4
			AND first_seq >= coalesce((SELECT max(first_seq) FROM stream_segments
				WHERE key = h.key AND token = h.token AND first_seq <= $3 + 1), 1)
		ORDER BY first_seq) g ON true
	WHERE h.key = $1 AND h.keep_until > $2
	ORDER BY g.first_seq`

// ReadEvents implements store.StreamRecorder, in one statement (one snapshot): the head, whether
// its claim is still held, and the segments holding the events after..after+limit. A live
// stream whose claim is gone or ran out of lease (its gateway died) reads as aborted.
func (s *Store) ReadEvents(key []byte, after uint64, limit int) (store.StreamPage, error) {
	var page store.StreamPage
	limit = max(limit, 0)
	err := s.query(func(ctx context.Context, db querier) error {
		now := s.now()
		from := int64(min(after, 1<<62))
		rows, err := db.Query(ctx, readEventsSQL, key, now, from, limit)
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
				first  *int64
				data   []byte
			)
			if err := rows.Scan(&page.Token, &state, &status, &header, &page.Events, &page.Bytes, &held, &first, &data); err != nil {
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
			if first != nil {
				if page.List, err = store.DecodeSegment(data, uint64(*first), after, limit, page.List); err != nil {
					return err
				}
			}
		}
		return rows.Err()
	})
	return page, err
}

// FindEvent implements store.StreamRecorder: an upstream's own id is found in stream_ids; a
// gateway-assigned id is the event's position.
func (s *Store) FindEvent(key []byte, id string) (uint64, bool, error) {
	var seq int64
	var found bool
	err := s.query(func(ctx context.Context, db querier) error {
		var events int64
		err := db.QueryRow(ctx, `SELECT h.events, coalesce((SELECT i.seq FROM stream_ids i
				WHERE i.key = h.key AND i.token = h.token AND i.id = $3), -1)
			FROM stream_heads h WHERE h.key = $1 AND h.keep_until > $2`, key, s.now(), []byte(id)).Scan(&events, &seq)
		switch {
		case err == pgx.ErrNoRows:
			return nil
		case err != nil:
			return err
		case seq > 0:
			found = true
		case seq == 0: // the upstream repeated the id: it names no one event
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
		return dropAttempts(ctx, tx, key, "=", token)
	})
}

// AbortStream implements store.StreamRecorder: while the key is still in flight under token,
// the key is released, the stream marked aborted and its events deleted, in one transaction. A
// key no longer held under token is left alone: a FinishStream whose commit landed although its
// caller saw an error must go on replaying, not be aborted afterwards.
func (s *Store) AbortStream(key []byte, token string) error {
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE key = $1 AND state = 1 AND token = $2`, key, token)
		if err != nil || tag.RowsAffected() == 0 {
			return err // the claim is already gone (finished, released, taken over): nothing to do
		}
		if _, err := tx.Exec(ctx, `UPDATE stream_heads SET state = 3 WHERE key = $1 AND token = $2`, key, token); err != nil {
			return err
		}
		return dropAttempts(ctx, tx, key, "=", token)
	})
}

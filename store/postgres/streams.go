package postgres

import (
	"cmp"
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
)

// The Store records event streams, so a duplicate on any replica joins, resumes or replays a
// keyed stream, and a follower on any replica follows an operation's (docs/streams.md). A batch of events is one row of stream_segments (as on
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
// id is replaced and its events deleted. What the holder holds by (the key's claim, or the
// operation) is locked while the head is written, so an attempt whose hold is being taken over
// cannot start a stream over the new one's.
func (s *Store) BeginStream(stream []byte, h store.StreamHolder, status int, header http.Header, keep time.Duration) error {
	hdr, err := store.EncodeHeader(header)
	if err != nil {
		return err
	}
	worker, opID := fenceColumns(stream, h)
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		if err := relaxed(ctx, tx); err != nil {
			return err
		}
		if held, err := lockHolder(ctx, tx, stream, h); err != nil || !held {
			return cmp.Or(err, error(domain{store.ErrNotHolder}))
		}
		_, err := tx.Exec(ctx, `INSERT INTO stream_heads (key, token, state, status, header, keep_until, holder, operation_id)
			VALUES ($1, $2, 1, $3, $4, $5, $6, $7)
			ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, state = 1, status = EXCLUDED.status,
				header = EXCLUDED.header, events = 0, bytes = 0, keep_until = EXCLUDED.keep_until,
				holder = EXCLUDED.holder, operation_id = EXCLUDED.operation_id`,
			stream, h.Token, status, hdr, s.now().Add(keep), worker, opID)
		if err != nil {
			return err
		}
		return dropAttempts(ctx, tx, stream, "<>", h.Token)
	})
}

// fenceColumns are what an operation's stream head keeps of its fence (migration 0008): the
// worker and the operation; both NULL for a keyed stream, fenced by its key's claim.
func fenceColumns(stream []byte, h store.StreamHolder) (worker, opID *string) {
	if h.Worker == "" {
		return nil, nil
	}
	id := string(stream)
	return &h.Worker, &id
}

// lockHolder reports whether h holds stream, and locks what it holds by (the key's row, or the
// operation's) until tx ends: no takeover commits between the check and tx's writes.
func lockHolder(ctx context.Context, tx pgx.Tx, stream []byte, h store.StreamHolder) (bool, error) {
	var err error
	if h.Worker == "" {
		err = tx.QueryRow(ctx, `SELECT 1 FROM idempotency_keys WHERE key = $1 AND state = 1 AND token = $2 FOR SHARE`,
			stream, h.Token).Scan(new(int))
	} else {
		err = tx.QueryRow(ctx, `SELECT 1 FROM operations WHERE id = $1 AND status = 'running' AND holder = $2 FOR SHARE`,
			string(stream), h.Worker).Scan(new(int))
	}
	if err == pgx.ErrNoRows {
		return false, nil
	}
	return err == nil, err
}

// streamFence locks what h holds by (lockHolder), or answers why h may not write stream (refusal).
func streamFence(ctx context.Context, tx pgx.Tx, stream []byte, h store.StreamHolder) error {
	held, err := lockHolder(ctx, tx, stream, h)
	if err != nil || held {
		return err
	}
	return refusal(ctx, tx, stream, h)
}

// refusal says why h may not write stream: ErrStreamNotLive when the stream is not live under
// h's attempt (finished, aborted, replaced), else ErrNotHolder (h lost what it held).
func refusal(ctx context.Context, db querier, stream []byte, h store.StreamHolder) error {
	var live bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM stream_heads WHERE key = $1 AND token = $2 AND state = 1)`,
		stream, h.Token).Scan(&live)
	switch {
	case err != nil:
		return err
	case live:
		return domain{store.ErrNotHolder}
	}
	return domain{store.ErrStreamNotLive}
}

// headHeldSQL is whether the holder of stream head h still holds: a keyed stream's key is in
// flight under the head's token; an operation's stream's operation runs under the head's holder.
const headHeldSQL = `CASE WHEN h.operation_id IS NULL
		THEN EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.key = h.key AND k.state = 1 AND k.token = h.token)
		ELSE EXISTS (SELECT 1 FROM operations o WHERE o.id = h.operation_id AND o.status = 'running' AND o.holder = h.holder) END`

// AppendEvents implements store.StreamRecorder in one statement, so one round trip: the head is
// advanced (fenced on the attempt's token, a live stream and a holder that still holds), the batch stored as one segment and
// the upstream's own ids indexed, in the statement's own transaction, which does not wait for
// the WAL flush (set_config, local to that transaction: see relaxed). An id the stream repeats,
// in this batch or an earlier one, is ambiguous and indexed at position 0, which FindEvent
// never finds (docs/streams.md).
func (s *Store) AppendEvents(stream []byte, h store.StreamHolder, events []store.StreamEvent) error {
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
			head AS (UPDATE stream_heads h SET events = h.events + $3, bytes = h.bytes + $4
				WHERE h.key = $1 AND h.token = $2 AND h.state = 1 AND `+headHeldSQL+` RETURNING h.events - $3 AS last),
			seg AS (INSERT INTO stream_segments (key, token, first_seq, last_seq, data)
				SELECT $1, $2, head.last + 1, head.last + $3, $5 FROM relaxed, head RETURNING first_seq),
			ids AS (INSERT INTO stream_ids (key, token, id, seq)
				SELECT $1, $2, i.id, CASE WHEN count(*) > 1 THEN 0 ELSE min(seg.first_seq + i.at - 1) END
				FROM seg, unnest($6::bytea[], $7::bigint[]) AS i(id, at)
				WHERE i.id <> convert_to((seg.first_seq + i.at - 1)::text, 'UTF8')
				GROUP BY i.id
				ON CONFLICT (key, token, id) DO UPDATE SET seq = 0)
			SELECT count(*) FROM seg`,
			stream, h.Token, len(events), size, segment, ids, at).Scan(&appended)
		if err != nil {
			return err
		}
		if appended == 0 {
			return refusal(ctx, db, stream, h)
		}
		return nil
	})
}

// readEventsSQL reads a stream's head, whether its holder still holds (lease included), and the segments holding
// the events after $3, up to $4 of them. The first of those segments is found by the primary
// key, as the last one starting at or before event $3+1 (segments are contiguous), so a page
// deep in a long stream reads its own segments and not every one before it.
const readEventsSQL = `SELECT h.token, h.state, h.status, h.header, h.events, h.bytes,
		coalesce(CASE WHEN h.operation_id IS NULL THEN k.state = 1 AND k.token = h.token AND k.lease_until > $2
			ELSE o.status = 'running' AND o.holder = h.holder AND o.lease_until > $2 END, false), g.first_seq, g.data
	FROM stream_heads h
	LEFT JOIN idempotency_keys k ON k.key = h.key
	LEFT JOIN operations o ON o.id = h.operation_id
	LEFT JOIN LATERAL (SELECT first_seq, data FROM stream_segments
		WHERE key = h.key AND token = h.token AND $4 > 0 AND last_seq > $3 AND first_seq <= $3 + $4
			AND first_seq >= coalesce((SELECT max(first_seq) FROM stream_segments
				WHERE key = h.key AND token = h.token AND first_seq <= $3 + 1), 1)
		ORDER BY first_seq) g ON true
	WHERE h.key = $1 AND h.keep_until > $2
	ORDER BY g.first_seq`

// ReadEvents implements store.StreamRecorder, in one statement (one snapshot): the head, whether
// its holder still holds, and the segments holding the events after..after+limit. A live stream
// whose holder lost its hold or ran out of lease (its gateway died) reads as aborted.
func (s *Store) ReadEvents(stream []byte, after uint64, limit int) (store.StreamPage, error) {
	var page store.StreamPage
	limit = max(limit, 0)
	err := s.query(func(ctx context.Context, db querier) error {
		now := s.now()
		from := int64(min(after, 1<<62))
		rows, err := db.Query(ctx, readEventsSQL, stream, now, from, limit)
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
func (s *Store) FindEvent(stream []byte, id string) (uint64, bool, error) {
	var seq int64
	var found bool
	err := s.query(func(ctx context.Context, db querier) error {
		var events int64
		err := db.QueryRow(ctx, `SELECT h.events, coalesce((SELECT i.seq FROM stream_ids i
				WHERE i.key = h.key AND i.token = h.token AND i.id = $3), -1)
			FROM stream_heads h WHERE h.key = $1 AND h.keep_until > $2`, stream, s.now(), []byte(id)).Scan(&events, &seq)
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

// FinishStream implements store.StreamRecorder: the stream is marked whole and, for a keyed
// stream, the key completed with its status and headers, in one transaction, which waits for
// the WAL flush. An operation's stream is kept until expires at most.
func (s *Store) FinishStream(stream []byte, h store.StreamHolder, expires time.Time) error {
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		if err := streamFence(ctx, tx, stream, h); err != nil {
			return err
		}
		var (
			status int32
			header []byte
			keep   time.Time
		)
		err := tx.QueryRow(ctx, `UPDATE stream_heads SET state = 2,
				keep_until = CASE WHEN operation_id IS NULL THEN keep_until ELSE least(keep_until, $3) END
			WHERE key = $1 AND token = $2 AND state = 1 RETURNING status, header, keep_until`, stream, h.Token, expires).Scan(&status, &header, &keep)
		if err == pgx.ErrNoRows {
			return domain{store.ErrStreamNotLive}
		}
		if err != nil || h.Worker != "" {
			return err
		}
		if expires.After(keep) {
			expires = keep // the events go at keep_until: the record must not outlive them
		}
		tag, err := tx.Exec(ctx, `UPDATE idempotency_keys SET rev = rev + 1, state = 2, token = '', lease_until = NULL,
			expires_at = $3, purge_at = $3, operation_id = NULL, response_status = $4, response_header = $5,
			response_body = '', streamed_rev = rev + 1 WHERE key = $1 AND state = 1 AND token = $2`, stream, h.Token, expires, status, header)
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
// deleted, in one transaction; a key stays claimed.
func (s *Store) DropStream(stream []byte, h store.StreamHolder) error {
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		if err := streamFence(ctx, tx, stream, h); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE stream_heads SET state = 3 WHERE key = $1 AND token = $2 AND state = 1`, stream, h.Token)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return domain{store.ErrStreamNotLive}
		}
		return dropAttempts(ctx, tx, stream, "=", h.Token)
	})
}

// AbortStream implements store.StreamRecorder: while h still holds, the stream is marked aborted,
// its events deleted and, for a keyed stream, the key released, in one transaction. A holder
// that no longer holds, and a stream already finished, are left alone: a FinishStream whose
// commit landed although its caller saw an error must go on replaying (a keyed stream's key is
// no longer held then; an operation's stream is finished while its operation still runs).
func (s *Store) AbortStream(stream []byte, h store.StreamHolder) error {
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		if held, err := lockHolder(ctx, tx, stream, h); err != nil || !held {
			return err // the claim or the operation is already gone: nothing to do
		}
		var finished bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM stream_heads WHERE key = $1 AND token = $2 AND state = 2)`,
			stream, h.Token).Scan(&finished)
		if err != nil || finished {
			return err // an operation's stream whose finish landed although its caller saw an error stays whole
		}
		if h.Worker == "" {
			if _, err := tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE key = $1 AND state = 1 AND token = $2`, stream, h.Token); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE stream_heads SET state = 3 WHERE key = $1 AND token = $2`, stream, h.Token); err != nil {
			return err
		}
		return dropAttempts(ctx, tx, stream, "=", h.Token)
	})
}

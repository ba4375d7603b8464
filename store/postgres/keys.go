package postgres

import (
	"context"
	"encoding/hex"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
)

// A claim outlives its lease by this much before the sweep removes it, so a late retry still
// sees an expired claim (as on Badger).
const claimKeptFor = time.Minute

// keyRow is a record as read, with the revision that fences a write to it.
type keyRow struct {
	rec *store.Record // nil when the row is absent or past its purge time
	rev int64         // 0: no row
}

// keyColumns are read by scanKey; k is the table's alias.
const keyColumns = `k.rev, k.fingerprint, k.state, k.token, k.claimed_at, k.lease_until, k.expires_at, k.purge_at,
	k.operation_id, k.response_status, k.response_header, k.response_body,
	coalesce(k.streamed_rev = k.rev, false)`

// scanKey reads keyColumns (after the leading targets) at now; the columns may all be NULL (no
// row).
func scanKey(row pgx.Row, now time.Time, leading ...any) (keyRow, error) {
	var (
		rev                     *int64
		fp, header, body        []byte
		state                   *int16
		token, opID             *string
		claimed, lease, expires *time.Time
		purgeAt                 *time.Time
		status                  *int32
		streamed                *bool
	)
	targets := append(leading, &rev, &fp, &state, &token, &claimed, &lease, &expires, &purgeAt, &opID, &status, &header, &body, &streamed)
	if err := row.Scan(targets...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return keyRow{}, nil
		}
		return keyRow{}, err
	}
	if rev == nil {
		return keyRow{}, nil
	}
	kr := keyRow{rev: *rev}
	if !now.Before(*purgeAt) {
		return kr, nil // reads as absent, as a record past its TTL does on Badger
	}
	rec := &store.Record{State: store.RecordState(*state), Fingerprint: fp, Token: *token, ClaimedAt: *claimed}
	rec.LeaseUntil, rec.ExpiresAt = deref(lease), deref(expires)
	if opID != nil {
		rec.OperationID = *opID
	}
	rec.Streamed = streamed != nil && *streamed
	if status != nil {
		resp, err := response(*status, header, body)
		if err != nil {
			return keyRow{}, err
		}
		rec.Response = resp
	}
	kr.rec = rec
	return kr, nil
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// response is a stored response; its header is as store.EncodeHeader wrote it.
func response(status int32, header, body []byte) (*store.Response, error) {
	resp := &store.Response{Status: int(status), Body: body}
	if resp.Body == nil {
		resp.Body = []byte{}
	}
	h, err := store.DecodeHeader(header)
	if err != nil {
		return nil, err
	}
	resp.Header = h
	return resp, nil
}

// ClaimKey claims key for a request whose fingerprint is fp (see store.Keys). A new key is
// inserted by one statement that also reads the record when there is one; store.AnswerFor
// decides; a record it finds claimable (a holder whose lease ran out, a record past its window)
// is taken by one statement fenced on the row's revision, so of two replicas taking it over one
// wins, and the previous holder's token no longer completes anything.
func (s *Store) ClaimKey(key, fp []byte, lease time.Duration) (store.Claim, error) {
	if rec := s.replays.get(key, s.now()); rec != nil && !s.closed.Load() {
		if c, answered := store.AnswerFor(rec, fp, s.now()); answered {
			return c, nil // a replay or a mismatch, from the record as this replica read it
		}
	}
	gen := s.replays.generation()
	var claim store.Claim
	err := s.query(func(ctx context.Context, db querier) error {
		for range 16 { // each round lost a race to another writer of the key
			now := s.now()
			token := store.NewToken()
			var inserted bool
			kr, err := scanKey(db.QueryRow(ctx, `WITH ins AS (
					INSERT INTO idempotency_keys (key, fingerprint, state, token, claimed_at, lease_until, purge_at)
					VALUES ($1, $2, 1, $3, $4, $5, $6) ON CONFLICT (key) DO NOTHING RETURNING 1)
				SELECT EXISTS (SELECT 1 FROM ins), `+keyColumns+`
				FROM (SELECT 1) one LEFT JOIN idempotency_keys k ON k.key = $1`,
				key, fp, token, now, now.Add(lease), now.Add(lease+claimKeptFor)), now, &inserted)
			if err != nil {
				return err
			}
			if inserted {
				claim = store.Claim{Outcome: store.Claimed, Token: token}
				return nil
			}
			if kr.rev == 0 {
				continue // the row that blocked the insert committed after this statement's snapshot
			}
			if c, answered := store.AnswerFor(kr.rec, fp, now); answered {
				claim = c
				s.replays.put(key, kr.rec, gen, now)
				return nil
			}
			tag, err := db.Exec(ctx, `UPDATE idempotency_keys SET rev = rev + 1, fingerprint = $3, state = 1, token = $4,
				claimed_at = $5, lease_until = $6, expires_at = NULL, purge_at = $7, operation_id = NULL,
				response_status = NULL, response_header = NULL, response_body = NULL
				WHERE key = $1 AND rev = $2`, key, kr.rev, fp, token, now, now.Add(lease), now.Add(lease+claimKeptFor))
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 1 {
				claim = store.Claim{Outcome: store.Claimed, Token: token}
				return nil
			}
		}
		return errors.New("claim: the key kept changing under contention")
	})
	return claim, err
}

// CompleteKey records resp for the key held under token (see store.Keys).
func (s *Store) CompleteKey(key []byte, token string, resp store.Response, expires time.Time) error {
	return s.query(func(ctx context.Context, db querier) error {
		return completeKey(ctx, db, key, token, "", resp, expires)
	})
}

// completeKey completes the claim held under token with resp (and the operation it accepted,
// if any); ErrNotHolder when the claim is no longer held under token.
func completeKey(ctx context.Context, db querier, key []byte, token, opID string, resp store.Response, expires time.Time) error {
	header, err := store.EncodeHeader(resp.Header)
	if err != nil {
		return err
	}
	tag, err := db.Exec(ctx, `UPDATE idempotency_keys SET rev = rev + 1, state = 2, token = '', lease_until = NULL,
		expires_at = $3, purge_at = $3, operation_id = nullif($4, ''), response_status = $5, response_header = $6, response_body = $7
		WHERE key = $1 AND state = 1 AND token = $2`, key, token, expires, opID, resp.Status, header, nonNil(resp.Body))
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return domain{store.ErrNotHolder}
	}
	return nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// ReleaseKey drops the claim held under token (see store.Keys).
func (s *Store) ReleaseKey(key []byte, token string) error {
	return s.query(func(ctx context.Context, db querier) error {
		tag, err := db.Exec(ctx, `DELETE FROM idempotency_keys WHERE key = $1 AND state = 1 AND token = $2`, key, token)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return domain{store.ErrNotHolder}
		}
		return nil
	})
}

// LookupKey returns the record of key, or nil when there is none (see store.Keys).
func (s *Store) LookupKey(key []byte) (*store.Record, error) {
	if rec := s.replays.get(key, s.now()); rec != nil && !s.closed.Load() {
		return rec, nil
	}
	gen := s.replays.generation()
	var rec *store.Record
	err := s.query(func(ctx context.Context, db querier) error {
		now := s.now()
		kr, err := scanKey(db.QueryRow(ctx, `SELECT `+keyColumns+` FROM idempotency_keys k WHERE k.key = $1`, key), now)
		if kr.rec.Live(now) {
			rec = kr.rec
			s.replays.put(key, rec, gen, now)
		}
		return err
	})
	return rec, err
}

// EvictKey deletes the record of key whatever its state (see store.Keys).
// The notice of the eviction to every replica's replay cache is sent by the same statement, so
// at its commit; this replica's own cache drops the key once the row is gone.
func (s *Store) EvictKey(key []byte) (bool, error) {
	found := false
	err := s.query(func(ctx context.Context, db querier) error {
		if len(key) > maxCachedKey { // never cached anywhere: nothing to tell
			tag, err := db.Exec(ctx, `DELETE FROM idempotency_keys WHERE key = $1 AND purge_at > $2`, key, s.now())
			found = tag.RowsAffected() == 1
			return err
		}
		return db.QueryRow(ctx, `WITH gone AS (DELETE FROM idempotency_keys WHERE key = $1 AND purge_at > $2 RETURNING 1)
			SELECT EXISTS (SELECT 1 FROM gone), pg_notify('`+keysChannel+`', $3)`, key, s.now(), hex.EncodeToString(key)).Scan(&found, nil)
	})
	s.replays.evicted(key)
	return found, err
}

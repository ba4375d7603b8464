package postgres

import (
	"context"
	"encoding/json"

	"github.com/mulligan-gw/mulligan/store"
)

// An operation accepted with a new key (or none), the common case, is stored by one statement
// that commits by itself: one round trip where the transaction took five (BEGIN, the key, the
// request, the operation, COMMIT), with the same durability (synchronous_commit on: the commit
// is flushed before the 202). Its parameters are opArgs ($1-$15), the request ($16, $17) and the
// key's row ($18-$25); they are cast because an INSERT ... SELECT does not type them.
const (
	acceptOpInsert = `INSERT INTO operations (id, scope, status, holder, lease_until, cancel_requested_at, expires_at, purge_at, doc,
			urgency, submitted_at, queue_deadline, lane, weight, lift)
		SELECT $1::text, $2::text, $3::text, $4::text, $5::timestamptz, $6::timestamptz, $7::timestamptz, $8::timestamptz, $9::bytea,
			$10::smallint, $11::timestamptz, $12::timestamptz, $13::text, $14::real, $15::smallint`
	acceptOpConflict = ` ON CONFLICT (id) DO UPDATE SET status = excluded.status, holder = excluded.holder,
		lease_until = excluded.lease_until, cancel_requested_at = excluded.cancel_requested_at,
		expires_at = excluded.expires_at, purge_at = excluded.purge_at, doc = excluded.doc,
		urgency = excluded.urgency, submitted_at = excluded.submitted_at, queue_deadline = excluded.queue_deadline,
		lane = excluded.lane, weight = excluded.weight, lift = excluded.lift`
	acceptUnkeyed = `WITH req AS (INSERT INTO operation_requests (op_id, doc, body) VALUES ($1, $16, $17))
		` + acceptOpInsert + acceptOpConflict + ` RETURNING true`
	// With a key: the request and the operation are written only when the key's row was
	// inserted; a key that has a row already leaves all three untouched, and the row is read
	// (as ClaimKey's statement does) for store.AnswerFor.
	acceptKeyed = `WITH ins AS (
			INSERT INTO idempotency_keys (key, fingerprint, state, claimed_at, expires_at, purge_at,
				operation_id, response_status, response_header, response_body)
			VALUES ($18, $19, 2, $20, $21, $21, $22, $23, $24, $25) ON CONFLICT (key) DO NOTHING RETURNING 1),
		req AS (INSERT INTO operation_requests (op_id, doc, body) SELECT $1::text, $16::bytea, $17::bytea WHERE EXISTS (SELECT 1 FROM ins)),
		op AS (` + acceptOpInsert + ` WHERE EXISTS (SELECT 1 FROM ins)` + acceptOpConflict + `)
		SELECT EXISTS (SELECT 1 FROM ins), ` + keyColumns + `
		FROM (SELECT 1) one LEFT JOIN idempotency_keys k ON k.key = $18`
)

// acceptAtOnce stores op, its request and a new key's 202 in one statement, or answers a retry
// from the key's row read by the same statement; it reports whether it did either. It leaves
// everything to the transaction (false, nothing written) when the caller holds the key's claim
// (a call converted while running), when the acceptance announces an event, and when the key's
// row may be taken over (a holder's lease ran out, a record past its window).
func (s *Store) acceptAtOnce(op *store.Operation, req *store.Request, key *store.KeyAccept) (store.Claim, bool, error) {
	if key != nil && key.Token != "" {
		return store.Claim{}, false, nil
	}
	if op.ScopeLimit > 0 { // the scope's count and the write need its lock: the transaction's way
		return store.Claim{}, false, nil
	}
	if a := s.announcer.Load(); a != nil && *a != nil && (*a)(op, nil) != nil {
		return store.Claim{}, false, nil
	}
	args, err := opArgs(op)
	if err != nil {
		return store.Claim{}, false, err
	}
	reqDoc, err := json.Marshal(req)
	if err != nil {
		return store.Claim{}, false, err
	}
	args = append(args, reqDoc, nonNil(req.Body))
	if key == nil {
		err := s.query(func(ctx context.Context, db querier) error {
			return db.QueryRow(ctx, acceptUnkeyed, args...).Scan(new(bool))
		})
		return store.Claim{Outcome: store.Claimed}, err == nil, err
	}
	header, err := store.EncodeHeader(key.Response.Header)
	if err != nil {
		return store.Claim{}, false, err
	}
	now := s.now()
	args = append(args, key.Key, key.Fingerprint, now, key.Expires, op.ID, key.Response.Status, header, nonNil(key.Response.Body))
	var (
		inserted bool
		kr       keyRow
	)
	err = s.query(func(ctx context.Context, db querier) (err error) {
		kr, err = scanKey(db.QueryRow(ctx, acceptKeyed, args...), now, &inserted)
		return err
	})
	switch {
	case err != nil:
		return store.Claim{}, false, err
	case inserted:
		return store.Claim{Outcome: store.Claimed}, true, nil
	}
	c, answered := store.AnswerFor(kr.rec, key.Fingerprint, now)
	return c, answered, nil
}

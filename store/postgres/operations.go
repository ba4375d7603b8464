package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
)

// opColumns are read by scanOp: the document, and the lease columns that renewals update
// without rewriting it.
const opColumns = `doc, holder, lease_until`

// scanOp reads an operation's opColumns, and more columns into extra.
func scanOp(row pgx.Row, extra ...any) (*store.Operation, error) {
	var doc []byte
	var holder *string
	var lease *time.Time
	if err := row.Scan(append([]any{&doc, &holder, &lease}, extra...)...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, domain{store.ErrNotFound}
		}
		return nil, err
	}
	return decodeOp(doc, holder, lease)
}

// decodeOp is the operation of a row: its document, with the lease columns over it.
func decodeOp(doc []byte, holder *string, lease *time.Time) (*store.Operation, error) {
	var op store.Operation
	if err := json.Unmarshal(doc, &op); err != nil {
		return nil, fmt.Errorf("operation document: %w", err)
	}
	op.Holder, op.LeaseUntil = "", deref(lease)
	if holder != nil {
		op.Holder = *holder
	}
	return &op, nil
}

func scanOps(rows pgx.Rows) ([]*store.Operation, error) {
	defer rows.Close()
	var out []*store.Operation
	for rows.Next() {
		op, err := scanOp(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, op)
	}
	return out, rows.Err()
}

// getOpForUpdate reads operation id, locking its row for the transaction.
func getOpForUpdate(ctx context.Context, tx pgx.Tx, id string, now time.Time) (*store.Operation, error) {
	if !storable(id) {
		return nil, domain{store.ErrNotFound}
	}
	return scanOp(tx.QueryRow(ctx, `SELECT `+opColumns+` FROM operations WHERE id = $1 AND (purge_at IS NULL OR purge_at > $2) FOR UPDATE`, id, now))
}

// putOp inserts or rewrites op, its document and its columns.
func putOp(ctx context.Context, db execer, op *store.Operation) error {
	return putOpRun(ctx, db, op, nil)
}

// putOpRun is putOp, writing as well into the row what the claim that starts op charged (c; nil
// for none), which runsSQL reads while it runs: one write of the row, not two.
func putOpRun(ctx context.Context, db execer, op *store.Operation, c *claimCharge) error {
	args, err := opArgs(op)
	if err != nil {
		return err
	}
	sql := insertOp + `
		ON CONFLICT (id) DO UPDATE SET status = $3, holder = $4, lease_until = $5, cancel_requested_at = $6,
			expires_at = $7, purge_at = $8, doc = $9, urgency = $10, submitted_at = $11, queue_deadline = $12,
			lane = $13, weight = $14, lift = $15`
	if c != nil {
		sql += runColumnsSet
		args = append(args, op.Holder, op.StartedAt, c.charged, c.band, c.newcomer, c.ncCharged)
	}
	_, err = db.Exec(ctx, sql, args...)
	return err
}

// insertOp writes a new operation's row from opArgs: every column a claim orders by is set, so
// no writer of operations (putOp, a batch's lines) can leave one at its default.
const insertOp = `INSERT INTO operations (id, scope, status, holder, lease_until, cancel_requested_at, expires_at, purge_at, doc,
			urgency, submitted_at, queue_deadline, lane, weight, lift)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`

// opArgs are the columns of op's row, in putOp's order ($1-$15); accept.go writes them too. The
// lane is NULL for an operation without a fairness key (its scope is its lane), the weight NULL
// for weight 1; the lift is kept within 0..7, as the urgency.
func opArgs(op *store.Operation) ([]any, error) {
	doc, err := json.Marshal(op)
	if err != nil {
		return nil, err
	}
	var expires, purge *time.Time
	if op.Status.Final() {
		e := op.ExpiresAt()
		p := e.Add(store.TombstoneFor)
		expires, purge = &e, &p
	}
	var holder *string
	var lease *time.Time
	if op.Holder != "" {
		holder, lease = &op.Holder, &op.LeaseUntil
	}
	var cancel *time.Time
	if !op.CancelRequestedAt.IsZero() {
		cancel = &op.CancelRequestedAt
	}
	var lane *string
	if k := store.LaneText(op.FairKey); k != "" {
		lane = &k
	}
	var weight *float32
	if w := float32(min(op.Weight, store.MaxWeight)); w > 1 {
		weight = &w
	}
	return []any{op.ID, op.Scope, string(op.Status), holder, lease, cancel, expires, purge, doc,
		store.ClampUrgency(op.Urgency), timeOrNull(op.SubmittedAt), timeOrNull(op.QueueDeadline), lane, weight,
		store.ClampUrgency(op.Lift)}, nil
}

// AcceptOperation stores op, its request and the key's 202 in one transaction (see
// store.Operations).
func (s *Store) AcceptOperation(op *store.Operation, req *store.Request, key *store.KeyAccept) (store.Claim, error) {
	gen, readAt := s.replays.generation(), s.now()
	if key != nil && key.Token == "" {
		if rec := s.replays.get(key.Key, readAt); rec != nil && !s.closed.Load() {
			if c, answered := store.AnswerFor(rec, key.Fingerprint, readAt); answered {
				return c, nil // a retry of an accepted request: its 202 again, from memory
			}
		}
	}
	if c, done, err := s.acceptAtOnce(op, req, key); err != nil || done {
		switch {
		case err != nil:
			return store.Claim{}, err
		case c.Outcome == store.Claimed && op.Status == store.StatusQueued:
			s.poke()
		case c.Outcome != store.Claimed:
			s.replays.put(key.Key, c.Record, gen, readAt)
		}
		return c, nil
	}
	var claim store.Claim
	queued := false
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		now := s.now()
		claim = store.Claim{Outcome: store.Claimed}
		if key != nil {
			answered, err := s.acceptKey(ctx, tx, key, op.ID, now)
			if err != nil || answered != nil {
				if answered != nil {
					claim = *answered
				}
				return err
			}
		}
		if err := scopeHasRoom(ctx, tx, op); err != nil {
			return err
		}
		reqDoc, err := json.Marshal(req)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO operation_requests (op_id, doc, body) VALUES ($1, $2, $3)`, op.ID, reqDoc, nonNil(req.Body)); err != nil {
			return err
		}
		if err := putOp(ctx, tx, op); err != nil {
			return err
		}
		queued = op.Status == store.StatusQueued
		return s.announce(ctx, tx, op, nil) // a call converted while running announces operation.running
	})
	if err != nil {
		return store.Claim{}, err
	}
	if queued && claim.Outcome == store.Claimed {
		s.poke()
	}
	if claim.Outcome != store.Claimed {
		s.replays.put(key.Key, claim.Record, gen, readAt)
	}
	return claim, nil
}

// scopeHasRoom refuses op with store.ErrScopeFull when its scope is at op.ScopeLimit. Accepts
// of one scope are serialised by a transaction-scoped advisory lock on the scope, taken before
// the count: the count's snapshot then includes every accept of the scope committed before this
// one, on any replica, and the next waits for this one to commit.
func scopeHasRoom(ctx context.Context, tx pgx.Tx, op *store.Operation) error {
	if op.ScopeLimit <= 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('mulligan scope ' || $1, 0))`, op.Scope); err != nil {
		return err
	}
	var n int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM operations WHERE scope = $1 AND status IN ('queued', 'running')`, op.Scope).Scan(&n)
	if err == nil && n >= op.ScopeLimit {
		err = domain{store.ErrScopeFull}
	}
	return err
}

// acceptKey completes key with the 202 in tx: the caller's claim when it holds one (Token),
// else a new record, unless the key already has one that answers (returned, nothing written).
func (s *Store) acceptKey(ctx context.Context, tx pgx.Tx, k *store.KeyAccept, opID string, now time.Time) (*store.Claim, error) {
	if k.Token != "" {
		return nil, completeKey(ctx, tx, k.Key, k.Token, opID, k.Response, k.Expires)
	}
	header, err := store.EncodeHeader(k.Response.Header)
	if err != nil {
		return nil, err
	}
	args := []any{k.Key, k.Fingerprint, now, k.Expires, opID, k.Response.Status, header, nonNil(k.Response.Body)}
	for range 4 { // the key changed between the statements: look again
		// A new key, the common case: one statement.
		tag, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (key, fingerprint, state, claimed_at, expires_at, purge_at,
				operation_id, response_status, response_header, response_body)
			VALUES ($1, $2, 2, $3, $4, $4, $5, $6, $7, $8) ON CONFLICT (key) DO NOTHING`, args...)
		if err != nil {
			return nil, err
		}
		if tag.RowsAffected() == 1 {
			return nil, nil
		}
		kr, err := scanKey(tx.QueryRow(ctx, `SELECT `+keyColumns+` FROM idempotency_keys k WHERE k.key = $1 FOR UPDATE`, k.Key), now)
		if err != nil {
			return nil, err
		}
		if c, answered := store.AnswerFor(kr.rec, k.Fingerprint, now); answered {
			return &c, nil
		}
		if kr.rev == 0 {
			continue // deleted meanwhile
		}
		// Claimable (a holder's lease ran out, a record past its window): the row is locked.
		if _, err := tx.Exec(ctx, `UPDATE idempotency_keys SET rev = rev + 1, fingerprint = $2, state = 2, token = '',
				claimed_at = $3, lease_until = NULL, expires_at = $4, purge_at = $4, operation_id = $5,
				response_status = $6, response_header = $7, response_body = $8
			WHERE key = $1`, args...); err != nil {
			return nil, err
		}
		return nil, nil
	}
	return nil, errors.New("accept: the key kept changing under contention")
}

// Transition moves operation id along the state machine, fenced by c.Holder, with its result
// and its event, in one transaction (see store.Operations).
func (s *Store) Transition(id string, c store.Change) (*store.Operation, error) {
	var out *store.Operation
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		now := s.now()
		op, err := getOpForUpdate(ctx, tx, id, now)
		if err != nil {
			return err
		}
		if err := fence(op, c, now); err != nil {
			return err
		}
		// The operation's writes go in one round trip; a batch's line counts itself in its
		// batch through tx meanwhile (countLine reads only the batch's row).
		p := &pipeline{}
		if out, err = s.apply(ctx, tx, p, op, c, now); err != nil {
			return err
		}
		return p.send(ctx, tx)
	})
	if err == nil && out.Status == store.StatusQueued {
		s.poke()
	}
	return out, err
}

// fence refuses a change guarded by c.Holder unless that worker holds op, and, with
// c.LeaseExpired, unless its lease ran out (the row is locked: no renewal slips in between).
func fence(op *store.Operation, c store.Change, now time.Time) error {
	if c.Holder == "" {
		return nil
	}
	if op.Status != store.StatusRunning || op.Holder != c.Holder {
		return domain{store.ErrNotHolder}
	}
	if c.LeaseExpired && now.Before(op.LeaseUntil) {
		return domain{store.ErrNotHolder}
	}
	return nil
}

// apply makes change c of the locked op in tx: the state machine's checks and bookkeeping
// (store.CanChange, store.Apply), the result, the request dropped, the event announced. Its
// writes go through w, tx or a pipeline of tx's writes; a batch's line is counted in its batch
// through tx.
func (s *Store) apply(ctx context.Context, tx pgx.Tx, w execer, op *store.Operation, c store.Change, now time.Time) (*store.Operation, error) {
	if !store.CanChange(op.Status, c) {
		return nil, domain{fmt.Errorf("%w: %s -> %s", store.ErrIllegalTransition, op.Status, c.To)}
	}
	at := c.At
	if at.IsZero() {
		at = now
	}
	run, ran := store.RunOf(op, c, at)
	store.Apply(op, c, at)
	if ran {
		if err := settleRun(ctx, w, run); err != nil {
			return nil, err
		}
	}
	if c.To.Final() {
		if err := finalize(ctx, w, op, c.Result); err != nil {
			return nil, err
		}
	}
	if err := s.countLine(ctx, tx, op, c.Result, at); err != nil {
		return nil, err
	}
	return op, s.write(ctx, w, op, c.Result)
}

// write stores op after a change of status, with the event that announces it.
func (s *Store) write(ctx context.Context, tx execer, op *store.Operation, result *store.Response) error {
	if err := putOp(ctx, tx, op); err != nil {
		return err
	}
	return s.announce(ctx, tx, op, result)
}

// finalize stores a final operation's result for its retention and drops its request.
func finalize(ctx context.Context, tx execer, op *store.Operation, result *store.Response) error {
	if result != nil {
		header, err := store.EncodeHeader(result.Header)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO operation_results (op_id, status, header, body, expires_at) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (op_id) DO UPDATE SET status = $2, header = $3, body = $4, expires_at = $5`,
			op.ID, result.Status, header, nonNil(result.Body), op.ExpiresAt()); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `DELETE FROM operation_requests WHERE op_id = $1`, op.ID)
	return err
}

// RequestCancel marks a queued or running operation as asked to stop and wakes the replicas, so
// the one running it learns of it at once (see store.Operations).
func (s *Store) RequestCancel(id string, at time.Time) (*store.Operation, error) {
	var out *store.Operation
	asked := false
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		op, err := getOpForUpdate(ctx, tx, id, s.now())
		if err != nil {
			return err
		}
		out = op
		if op.Status.Final() || !op.CancelRequestedAt.IsZero() {
			return nil
		}
		op.CancelRequestedAt, op.Version, op.UpdatedAt = at, op.Version+1, at
		asked = true
		return putOp(ctx, tx, op)
	})
	if asked && err == nil {
		s.poke()
	}
	return out, err
}

// RecordAttempt counts one more attempt of a running operation; others are returned as they
// are (see store.Operations).
func (s *Store) RecordAttempt(id string) (*store.Operation, error) {
	var out *store.Operation
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		op, err := getOpForUpdate(ctx, tx, id, s.now())
		if err != nil {
			return err
		}
		out = op
		if op.Status != store.StatusRunning {
			return nil
		}
		op.Attempts, op.UpdatedAt = op.Attempts+1, s.now()
		return putOp(ctx, tx, op)
	})
	return out, err
}

// GetOperation returns operation id, or store.ErrNotFound.
func (s *Store) GetOperation(id string) (*store.Operation, error) {
	if !storable(id) {
		return nil, store.ErrNotFound
	}
	var out *store.Operation
	err := s.query(func(ctx context.Context, db querier) error {
		var err error
		out, err = scanOp(db.QueryRow(ctx, `SELECT `+opColumns+` FROM operations WHERE id = $1 AND (purge_at IS NULL OR purge_at > $2)`, id, s.now()))
		return err
	})
	return out, err
}

// LoadRequest returns the stored request of a queued or running operation.
func (s *Store) LoadRequest(id string) (*store.Request, error) {
	if !storable(id) {
		return nil, store.ErrNotFound
	}
	var req store.Request
	err := s.query(func(ctx context.Context, db querier) error {
		var doc, body []byte
		err := db.QueryRow(ctx, `SELECT doc, body FROM operation_requests WHERE op_id = $1`, id).Scan(&doc, &body)
		if errors.Is(err, pgx.ErrNoRows) {
			return domain{store.ErrNotFound}
		}
		if err != nil {
			return err
		}
		req.Body = body
		return json.Unmarshal(doc, &req)
	})
	return &req, err
}

// LoadResult returns the stored upstream response of a final operation within its retention,
// or store.ErrNotFound.
func (s *Store) LoadResult(id string) (*store.Response, error) {
	if !storable(id) {
		return nil, store.ErrNotFound
	}
	var out *store.Response
	err := s.query(func(ctx context.Context, db querier) error {
		var status int32
		var header, body []byte
		err := db.QueryRow(ctx, `SELECT status, header, body FROM operation_results WHERE op_id = $1 AND expires_at > $2`, id, s.now()).
			Scan(&status, &header, &body)
		if errors.Is(err, pgx.ErrNoRows) {
			return domain{store.ErrNotFound}
		}
		if err != nil {
			return err
		}
		out, err = response(status, header, body)
		return err
	})
	return out, err
}

// ListOperations returns scope's operations newest first (see store.Operations).
func (s *Store) ListOperations(scope string, status store.Status, after string, limit int) ([]*store.Operation, string, error) {
	return s.list(&scope, status, after, limit)
}

// ListAllOperations is ListOperations across every scope.
func (s *Store) ListAllOperations(status store.Status, after string, limit int) ([]*store.Operation, string, error) {
	return s.list(nil, status, after, limit)
}

// listQuery is the query of a list page at now: scope's operations (every scope's when nil)
// in status as store.Operation.As reads it, below the cursor after (none when ""), at most
// limit, newest first. Each part is written only when it applies, so the plan walks the index
// that has the page in order (scope and status, then id) rather than filtering a whole history.
func listQuery(scope *string, status store.Status, after string, limit int, now time.Time) (string, []any) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if scope != nil {
		where = append(where, "scope = "+arg(*scope))
	}
	switch {
	case status == "":
	case status == store.StatusExpired: // a final operation past its retention
		where = append(where, "expires_at <= "+arg(now))
	case status.Final():
		where = append(where, "status = "+arg(string(status)), "expires_at > "+arg(now))
	default:
		where = append(where, "status = "+arg(string(status)))
	}
	if after != "" {
		where = append(where, "id < "+arg(after))
	}
	where = append(where, "(purge_at IS NULL OR purge_at > "+arg(now)+")")
	return `SELECT ` + opColumns + ` FROM operations WHERE ` + strings.Join(where, " AND ") +
		` ORDER BY id DESC LIMIT ` + arg(limit), args
}

// list runs a list query for one more than limit: if it comes, the page ends early and the
// last operation returned is the cursor.
func (s *Store) list(scope *string, status store.Status, after string, limit int) ([]*store.Operation, string, error) {
	if limit <= 0 {
		return nil, "", nil
	}
	limit = min(limit, math.MaxInt32) // limit+1 below must not wrap round to a negative LIMIT
	if c, bounded := ceiling(after); !bounded {
		after = "" // every id sorts below it
	} else {
		after = c
	}
	var ops []*store.Operation
	err := s.query(func(ctx context.Context, db querier) error {
		sql, args := listQuery(scope, status, after, limit+1, s.now())
		rows, err := db.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		ops, err = scanOps(rows)
		return err
	})
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(ops) > limit {
		ops = ops[:limit]
		next = ops[len(ops)-1].ID
	}
	return ops, next, nil
}

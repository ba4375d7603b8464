package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// TombstoneFor is how long an expired operation still answers (as expired) before it is gone.
const TombstoneFor = 7 * 24 * time.Hour

// Operation is one asynchronous upstream call.
type Operation struct {
	ID                string          `json:"id"`
	Scope             string          `json:"scope"`            // hash of the tenant scope
	Server            string          `json:"server,omitempty"` // the Caddy server that accepted it
	Status            Status          `json:"status"`
	Version           int64           `json:"version"`
	Method            string          `json:"method"`
	Path              string          `json:"path"`
	IdempotencyKey    string          `json:"idempotency_key,omitempty"`
	SubmittedAt       time.Time       `json:"submitted_at"`
	StartedAt         time.Time       `json:"started_at,omitzero"`
	FinishedAt        time.Time       `json:"finished_at,omitzero"`
	CancelRequestedAt time.Time       `json:"cancel_requested_at,omitzero"`
	Attempts          int             `json:"attempts"`
	Retention         time.Duration   `json:"retention"`
	Error             *OperationError `json:"error,omitempty"`
	Result            *ResultMeta     `json:"result,omitempty"`
	Callback          *Callback       `json:"callback,omitempty"`
	// Holder is the worker (one runner of one replica) executing a running operation, and
	// LeaseUntil how long its claim lasts unless renewed (Queue.RenewLeases).
	Holder     string    `json:"holder,omitempty"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// Exec is what executing the operation needs from the configuration block that accepted
	// it; nil for operations stored before it existed (the runner's defaults apply).
	Exec *Execution `json:"exec,omitempty"`
	// Type is the operation's kind (the accepting block's async type, else the route path).
	Type string `json:"type,omitempty"`
	// Metadata is the request body's top-level "metadata" object, compact JSON, echoed in the
	// resource and every event; nil when the request had none.
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// UpdatedAt is when the operation last changed (status, attempts, cancel request).
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	// Traceparent and Tracestate are the submitting request's W3C Trace Context: every upstream
	// attempt, log line and webhook delivery of the operation carries them.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
	// Urgency is the RFC 9218 urgency the operation waits at: 0 (most urgent) to 7; 3 by default.
	Urgency int `json:"urgency"`
	// QueueDeadline is when a still-queued operation stops being worth running: it fails
	// QUEUE_TIMEOUT without reaching the upstream. Zero: no deadline.
	QueueDeadline time.Time `json:"queue_deadline,omitzero"`
	// Batch tags a batch's line operation (docs/batches.md); nil for every other operation.
	Batch *BatchLine `json:"batch,omitempty"`
}

// Execution is how an operation is to be run, stored with it so that every reload, restart
// and replica honours the settings of the block that accepted it (docs/caddyfile.md).
type Execution struct {
	// Timeout bounds one execution.
	Timeout time.Duration `json:"timeout,omitempty"`
	// Retries is how many times a retryable upstream failure is tried again.
	Retries int `json:"retries,omitempty"`
	// RetryOn are the upstream statuses retried (connection errors always are); empty for
	// operations stored before it existed (the default set applies).
	RetryOn []int `json:"retry_on,omitempty"`
	// MaxResult is the largest upstream response kept, in bytes.
	MaxResult int64 `json:"max_result,omitempty"`
	// OnCrash is "requeue" or "fail": what a takeover does when the operation's replica died.
	OnCrash string `json:"on_crash,omitempty"`
	// Events are the webhook event types the block delivers about it.
	Events []string `json:"events,omitempty"`
	// Prefix is where the block serves operations, for the links its events carry.
	Prefix string `json:"prefix,omitempty"`
}

// OperationError is why an operation failed.
type OperationError struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
}

// ResultMeta describes the stored upstream response of a finished operation.
type ResultMeta struct {
	Status      int    `json:"status"`
	ContentType string `json:"content_type,omitempty"`
	Size        int    `json:"size"`
}

// ExpiresAt is when a final operation's result goes and it reads as expired; zero before final.
func (op *Operation) ExpiresAt() time.Time {
	if op.FinishedAt.IsZero() {
		return time.Time{}
	}
	return op.FinishedAt.Add(op.Retention)
}

// As returns op as seen at now: past its retention a final operation reads as expired, one
// version later, without its result or error.
func (op *Operation) As(now time.Time) *Operation {
	if !op.Status.Final() || now.Before(op.ExpiresAt()) {
		return op
	}
	c := *op
	c.Status, c.Version, c.Result, c.Error = StatusExpired, op.Version+1, nil, nil
	return &c
}

// Request is an accepted request as it will be sent upstream.
type Request struct {
	Method     string      `json:"method"`
	URL        string      `json:"url"` // request URI: path and query
	Host       string      `json:"host"`
	Proto      string      `json:"proto,omitempty"`
	RemoteAddr string      `json:"remote_addr,omitempty"`
	Header     http.Header `json:"header"`
	Body       []byte      `json:"-"`
}

// Domain errors of operations.
var (
	ErrNotFound          = errors.New("operation not found")
	ErrIllegalTransition = errors.New("illegal status transition")
)

// KeyAccept ties an accepted operation to its idempotency key: the key is completed with the
// 202 response in the same transaction that stores the operation.
type KeyAccept struct {
	Key, Fingerprint []byte
	// Token is the caller's claim when the key is already held (a call converted after it
	// started); empty to claim and complete the key in one step.
	Token    string
	Response Response
	Expires  time.Time
}

// AcceptOperation durably stores op (queued or running) and the request it will send, and
// completes key with the 202 answer, all in one transaction. With a key that already has a
// record (and no token), nothing is stored and the claim outcome is returned instead.
func (s *Store) AcceptOperation(op *Operation, req *Request, key *KeyAccept) (Claim, error) {
	if key != nil {
		unlock := s.locks.lock(key.Key)
		defer unlock()
		if key.Token == "" {
			rec, err := s.LookupKey(key.Key)
			if err != nil {
				return Claim{}, err
			}
			if claim, answered := AnswerFor(rec, key.Fingerprint, s.now()); answered {
				return claim, nil
			}
		}
	}
	unlockOp := s.sh.opLocks.lock([]byte(op.ID))
	defer unlockOp()
	err := s.updateThen(func(txn *badger.Txn) error {
		if key != nil {
			if err := completeInTxn(txn, key, op.ID, s.now()); err != nil {
				return err
			}
		}
		if err := putRequest(txn, op.ID, req); err != nil {
			return err
		}
		if err := txn.Set(scopeIndexKey(op.Scope, op.ID), nil); err != nil {
			return err
		}
		if err := putOperation(txn, op, nil); err != nil {
			return err
		}
		return s.announce(txn, op, nil) // a call converted while running announces operation.running
	}, func() {
		// A call converted while running is held by the worker running it, live in this process.
		s.sh.queue.live(op.Holder, op.LeaseUntil)
		s.sh.queue.moved(op, "")
	})
	if err != nil {
		return Claim{}, err
	}
	return Claim{Outcome: Claimed}, nil
}

func completeInTxn(txn *badger.Txn, k *KeyAccept, opID string, now time.Time) error {
	rec := &Record{Fingerprint: k.Fingerprint, ClaimedAt: now}
	if k.Token != "" {
		held, err := heldRecord(txn, k.Key, k.Token)
		if err != nil {
			return err
		}
		rec = held
	}
	rec.State, rec.Token, rec.LeaseUntil, rec.ExpiresAt = Completed, "", time.Time{}, k.Expires
	rec.OperationID = opID
	resp := k.Response
	rec.Response = &resp
	return putRecord(txn, k.Key, rec, time.Until(k.Expires))
}

// Change is one step of the state machine, with what it brings along.
type Change struct {
	To Status
	// Error is set on failed operations.
	Error *OperationError
	// Result is the upstream response, stored with a final status (failed ones too).
	Result *Response
	// At is the moment of the change; zero means now.
	At time.Time
	// Holder, when set, fences the change to the worker holding the operation: it fails with
	// ErrNotHolder when the operation is held by another worker or by none (a late worker whose
	// operation was taken over changes nothing).
	Holder string
	// LeaseExpired, with Holder, applies the change only while Holder's lease has run out
	// (ErrNotHolder otherwise): a takeover never races a renewal. On Badger a lease also runs out
	// when its worker is not live in this process (after a restart: at once).
	LeaseExpired bool
}

// Transition moves operation id to c.To if the state machine allows it, bumping its version,
// keeping the queue and running indexes in step, and storing the result with a final status.
// A final operation's request is dropped and its result kept for the operation's retention.
func (s *Store) Transition(id string, c Change) (*Operation, error) {
	return s.change(id, c, "", 0)
}

// change applies c to operation id; with claimBy set, the move to running is a claim by that
// worker for lease (ClaimNext).
func (s *Store) change(id string, c Change, claimBy string, lease time.Duration) (*Operation, error) {
	// Two writers of one operation (a claim and a cancel) commit one after the other; without
	// this their in-memory moves could land in the other order and leave a stale lease behind.
	unlock := s.sh.opLocks.lock([]byte(id))
	defer unlock()
	var out *Operation
	var prev Status
	committed := false
	err := s.updateThen(func(txn *badger.Txn) error {
		op, err := getOperation(txn, id)
		if err != nil {
			return err
		}
		at := c.At
		if at.IsZero() {
			at = s.now()
		}
		if err := s.fence(op, c, at); err != nil {
			return err
		}
		if !CanTransition(op.Status, c.To) {
			return domainError{fmt.Errorf("%w: %s -> %s", ErrIllegalTransition, op.Status, c.To)}
		}
		prev = op.Status
		Apply(op, c, at)
		if err := s.countLine(txn, op, at); err != nil {
			return err
		}
		if claimBy != "" {
			op.Holder, op.LeaseUntil = claimBy, at.Add(lease)
		}
		if c.To.Final() {
			if err := s.finalize(txn, op, c.Result); err != nil {
				return err
			}
		}
		if err := putOperation(txn, op, &prev); err != nil {
			return err
		}
		out = op
		return s.announce(txn, op, c.Result)
	}, func() { committed = true; s.sh.queue.moved(out, prev) })
	if !committed {
		return nil, err
	}
	return out, err // with an error, the change is stored but its fsync failed
}

// fence refuses a change guarded by c.Holder unless that worker holds op (and, with
// c.LeaseExpired, unless its lease ran out: then it is revoked, so the holder cannot renew it).
func (s *Store) fence(op *Operation, c Change, now time.Time) error {
	if c.Holder == "" {
		return nil
	}
	if op.Status != StatusRunning || op.Holder != c.Holder {
		return domainError{ErrNotHolder}
	}
	if c.LeaseExpired && !s.sh.queue.revokeIfExpired(op.ID, c.Holder, now) {
		return domainError{ErrNotHolder}
	}
	return nil
}

// Apply makes the state machine's bookkeeping of c on op, whatever the backend: the status,
// the version, the start and finish times, the attempt count, the error, the result's
// description, and the holder that a move out of running drops. The caller has checked
// CanTransition.
func Apply(op *Operation, c Change, at time.Time) {
	op.Status, op.Version, op.UpdatedAt = c.To, op.Version+1, at
	switch c.To {
	case StatusRunning:
		op.StartedAt, op.Attempts = at, op.Attempts+1
	case StatusQueued:
		op.StartedAt = time.Time{}
	}
	if c.To != StatusRunning {
		op.Holder, op.LeaseUntil = "", time.Time{}
	}
	if c.To.Final() {
		op.FinishedAt, op.Error = at, c.Error
		if r := c.Result; r != nil {
			op.Result = &ResultMeta{Status: r.Status, ContentType: r.Header.Get("Content-Type"), Size: len(r.Body)}
		}
	}
}

// finalize stores the result with the retention TTL, drops the request, and gives the
// operation and its scope index entry the tombstone's lifetime.
func (s *Store) finalize(txn *badger.Txn, op *Operation, result *Response) error {
	if result != nil {
		v, err := encode(result, result.Body)
		if err != nil {
			return err
		}
		if err := txn.SetEntry(badger.NewEntry(resultKey(op.ID), v).WithTTL(op.Retention)); err != nil {
			return err
		}
	}
	if err := txn.Delete(requestKey(op.ID)); err != nil {
		return err
	}
	return txn.SetEntry(badger.NewEntry(scopeIndexKey(op.Scope, op.ID), nil).WithTTL(op.Retention + TombstoneFor))
}

// RequestCancel marks a running operation as asked to stop, so a restart does not run it again.
func (s *Store) RequestCancel(id string, at time.Time) (*Operation, error) {
	var out *Operation
	err := s.update(func(txn *badger.Txn) error {
		op, err := getOperation(txn, id)
		if err != nil {
			return err
		}
		if op.Status.Final() {
			out = op
			return nil
		}
		if op.CancelRequestedAt.IsZero() {
			op.CancelRequestedAt, op.Version, op.UpdatedAt = at, op.Version+1, at
		}
		out = op
		return putOperation(txn, op, &op.Status)
	})
	return out, err
}

// GetOperation returns operation id, or ErrNotFound.
func (s *Store) GetOperation(id string) (*Operation, error) {
	var op *Operation
	err := s.view(func(txn *badger.Txn) error {
		var err error
		op, err = getOperation(txn, id)
		return err
	})
	return op, err
}

// LoadRequest returns the stored request of a queued or running operation.
func (s *Store) LoadRequest(id string) (*Request, error) {
	var req Request
	err := s.view(func(txn *badger.Txn) error {
		return getValue(txn, requestKey(id), func(v []byte) error {
			body, err := decode(v, &req)
			req.Body = body
			return err
		})
	})
	return &req, err
}

// LoadResult returns the stored upstream response of a final operation, or ErrNotFound when it
// has none (never reached the upstream, or past retention).
func (s *Store) LoadResult(id string) (*Response, error) {
	var resp Response
	err := s.view(func(txn *badger.Txn) error {
		op, err := getOperation(txn, id)
		if err != nil {
			return err
		}
		if op.As(s.now()).Status == StatusExpired { // its TTL runs on the wall clock, not on s.now
			return domainError{ErrNotFound}
		}
		return getValue(txn, resultKey(id), func(v []byte) error {
			body, err := decode(v, &resp)
			resp.Body = body
			return err
		})
	})
	return &resp, err
}

// OperationsIn returns the ids of operations in status (queued or running), oldest first.
func (s *Store) OperationsIn(status Status) ([]string, error) {
	prefix := indexPrefix(status)
	var ids []string
	err := s.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			ids = append(ids, string(it.Item().Key()[len(prefix):]))
		}
		return nil
	})
	return ids, err
}

// listScanBudget bounds the operations one list call reads: filtering by status may have to
// skip many, and a page may then hold fewer than limit, with a cursor to go on from.
const listScanBudget = 2000

// ListOperations returns scope's operations newest first, after the id `after` (exclusive,
// for paging), optionally only those in status, at most limit. When it stopped before the end
// of the list, next is the id to pass as `after` for the rest.
func (s *Store) ListOperations(scope string, status Status, after string, limit int) (ops []*Operation, next string, err error) {
	return s.listOperations(scopeIndexKey(scope, ""), status, after, limit)
}

// ListAllOperations is ListOperations across every scope, for operators.
func (s *Store) ListAllOperations(status Status, after string, limit int) ([]*Operation, string, error) {
	return s.listOperations([]byte(prefixOperation), status, after, limit)
}

// listOperations walks an index whose keys end in operation ids, newest first.
func (s *Store) listOperations(prefix []byte, status Status, after string, limit int) ([]*Operation, string, error) {
	var ops []*Operation
	next := ""
	err := s.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: true})
		defer it.Close()
		seek := append(append([]byte(nil), prefix...), 0xff)
		if after != "" {
			seek = append(append([]byte(nil), prefix...), after...)
		}
		scanned, last := 0, ""
		for it.Seek(seek); it.Valid() && len(ops) < limit && scanned < listScanBudget; it.Next() {
			id := string(it.Item().Key()[len(prefix):])
			if id == after {
				continue
			}
			scanned, last = scanned+1, id
			op, err := getOperation(txn, id)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if status == "" || op.As(s.now()).Status == status {
				ops = append(ops, op)
			}
		}
		if it.Valid() { // stopped before the end: the rest follows the last one examined
			next = last
		}
		return nil
	})
	return ops, next, err
}

func getOperation(txn *badger.Txn, id string) (*Operation, error) {
	var op Operation
	err := getValue(txn, operationKey(id), func(v []byte) error {
		_, err := decode(v, &op)
		return err
	})
	return &op, err
}

// putOperation writes op and moves its queue/running index entry from prev's to its own.
func putOperation(txn *badger.Txn, op *Operation, prev *Status) error {
	if prev != nil && *prev != op.Status {
		if p := indexPrefix(*prev); p != nil {
			if err := txn.Delete(append(p, op.ID...)); err != nil {
				return err
			}
		}
	}
	if p := indexPrefix(op.Status); p != nil {
		if err := txn.Set(append(p, op.ID...), nil); err != nil {
			return err
		}
	}
	v, err := encode(op, nil)
	if err != nil {
		return err
	}
	e := badger.NewEntry(operationKey(op.ID), v)
	if op.Status.Final() {
		e = e.WithTTL(time.Until(op.ExpiresAt()) + TombstoneFor)
	}
	return txn.SetEntry(e)
}

func putRequest(txn *badger.Txn, id string, req *Request) error {
	v, err := encode(req, req.Body)
	if err != nil {
		return err
	}
	return txn.Set(requestKey(id), v)
}

// getValue reads key into fn, mapping a missing key to ErrNotFound.
func getValue(txn *badger.Txn, key []byte, fn func([]byte) error) error {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return domainError{ErrNotFound}
	}
	if err != nil {
		return err
	}
	return item.Value(fn)
}

// RecordAttempt counts one more upstream attempt of a running operation (a retry); any other
// operation, a final one above all, is returned as it is.
func (s *Store) RecordAttempt(id string) (*Operation, error) {
	var out *Operation
	err := s.updateIf(func(txn *badger.Txn) (bool, error) {
		op, err := getOperation(txn, id)
		if err != nil {
			return false, err
		}
		out = op
		if op.Status != StatusRunning {
			return false, nil
		}
		op.Attempts, op.UpdatedAt = op.Attempts+1, s.now()
		return true, putOperation(txn, op, &op.Status)
	})
	return out, err
}

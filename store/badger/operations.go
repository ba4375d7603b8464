package badger

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/mulligan-gw/mulligan/store"
)

// AcceptOperation durably stores op (queued or running) and the request it will send, and
// completes key with the 202 answer, all in one transaction. With a key that already has a
// record (and no token), nothing is stored and the claim outcome is returned instead.
func (s *Store) AcceptOperation(op *store.Operation, req *store.Request, key *store.KeyAccept) (store.Claim, error) {
	if key != nil {
		unlock := s.locks.lock(key.Key)
		defer unlock()
		if key.Token == "" {
			rec, err := s.LookupKey(key.Key)
			if err != nil {
				return store.Claim{}, err
			}
			if claim, answered := store.AnswerFor(rec, key.Fingerprint, s.now()); answered {
				return claim, nil
			}
		}
	}
	if op.ScopeLimit > 0 {
		// One accept of a limited scope at a time: its count includes every operation stored
		// before it (the queue's memory is updated before the lock is released).
		unlockScope := s.sh.scopeLocks.lock([]byte(op.Scope))
		defer unlockScope()
		if n, err := s.ActiveCount(op.Scope); err != nil || n >= op.ScopeLimit {
			return store.Claim{}, cmp.Or(err, error(domainError{store.ErrScopeFull}))
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
		return store.Claim{}, err
	}
	return store.Claim{Outcome: store.Claimed}, nil
}

func completeInTxn(txn *badger.Txn, k *store.KeyAccept, opID string, now time.Time) error {
	rec := &store.Record{Fingerprint: k.Fingerprint, ClaimedAt: now}
	if k.Token != "" {
		held, err := heldRecord(txn, k.Key, k.Token)
		if err != nil {
			return err
		}
		rec = held
	}
	rec.State, rec.Token, rec.LeaseUntil, rec.ExpiresAt = store.Completed, "", time.Time{}, k.Expires
	rec.OperationID = opID
	resp := k.Response
	rec.Response = &resp
	return putRecord(txn, k.Key, rec, time.Until(k.Expires))
}

// Transition moves operation id to c.To if the state machine allows it, bumping its version,
// keeping the queue and running indexes in step, and storing the result with a final status.
// A final operation's request is dropped and its result kept for the operation's retention.
func (s *Store) Transition(id string, c store.Change) (*store.Operation, error) {
	return s.change(id, c, "", 0)
}

// change applies c to operation id; with claimBy set, the move to running is a claim by that
// worker for lease (ClaimNext).
func (s *Store) change(id string, c store.Change, claimBy string, lease time.Duration) (*store.Operation, error) {
	// Two writers of one operation (a claim and a cancel) commit one after the other; without
	// this their in-memory moves could land in the other order and leave a stale lease behind.
	unlock := s.sh.opLocks.lock([]byte(id))
	defer unlock()
	if batch := store.BatchOfLine(id); batch != "" {
		// A batch's lines finishing at once all rewrite the batch: one at a time, rather than
		// in conflicting transactions retried (the batch lock is taken after the line's).
		unlockBatch := s.sh.batchLocks.lock([]byte(batch))
		defer unlockBatch()
	}
	var out *store.Operation
	var prev store.Status
	var run store.Run
	var ran bool
	committed := false
	apply := func(txn *badger.Txn) error {
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
		if !store.CanChange(op.Status, c) {
			return domainError{fmt.Errorf("%w: %s -> %s", store.ErrIllegalTransition, op.Status, c.To)}
		}
		prev = op.Status
		run, ran = store.RunOf(op, c, at)
		store.Apply(op, c, at)
		if err := s.countLine(txn, op, c.Result, at); err != nil {
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
	}
	// A claim waits for its fsync only when a crash must fail the operation (store.ClaimMustBeDurable).
	err := s.write(func(txn *badger.Txn) (bool, error) { return true, apply(txn) },
		func() {
			committed = true
			s.sh.queue.movedAfterRun(out, prev, run, ran)
		},
		func() bool { return claimBy == "" || store.ClaimMustBeDurable(out) })
	if !committed {
		return nil, err
	}
	return out, err // with an error, the change is stored but its fsync failed
}

// fence refuses a change guarded by c.Holder unless that worker holds op (and, with
// c.LeaseExpired, unless its lease ran out: then it is revoked, so the holder cannot renew it).
func (s *Store) fence(op *store.Operation, c store.Change, now time.Time) error {
	if c.Holder == "" {
		return nil
	}
	if op.Status != store.StatusRunning || op.Holder != c.Holder {
		return domainError{store.ErrNotHolder}
	}
	if c.LeaseExpired && !s.sh.queue.revokeIfExpired(op.ID, c.Holder, now) {
		return domainError{store.ErrNotHolder}
	}
	return nil
}

// finalize stores the result with the retention TTL, drops the request, and gives the
// operation and its scope index entry the tombstone's lifetime.
func (s *Store) finalize(txn *badger.Txn, op *store.Operation, result *store.Response) error {
	if result != nil {
		if err := txn.SetEntry(badger.NewEntry(resultKey(op.ID), store.EncodeResponse(result)).WithTTL(op.Retention)); err != nil {
			return err
		}
	}
	if err := txn.Delete(requestKey(op.ID)); err != nil {
		return err
	}
	return txn.SetEntry(badger.NewEntry(scopeIndexKey(op.Scope, op.ID), nil).WithTTL(op.Retention + store.TombstoneFor))
}

// RequestCancel marks a running operation as asked to stop, so a restart does not run it again.
func (s *Store) RequestCancel(id string, at time.Time) (*store.Operation, error) {
	var out *store.Operation
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
func (s *Store) GetOperation(id string) (*store.Operation, error) {
	return read(s, getOperation, id)
}

// LoadRequest returns the stored request of a queued or running operation.
func (s *Store) LoadRequest(id string) (*store.Request, error) {
	req := &store.Request{}
	err := s.view(func(txn *badger.Txn) error {
		return getValue(txn, requestKey(id), func(v []byte) error {
			r, err := store.DecodeRequest(v)
			if err == nil {
				req = r
			}
			return err
		})
	})
	return req, err
}

// LoadResult returns the stored upstream response of a final operation, or ErrNotFound when it
// has none (never reached the upstream, or past retention).
func (s *Store) LoadResult(id string) (*store.Response, error) {
	resp := &store.Response{}
	err := s.view(func(txn *badger.Txn) error {
		op, err := getOperation(txn, id)
		if err != nil {
			return err
		}
		if op.As(s.now()).Status == store.StatusExpired { // its TTL runs on the wall clock, not on s.now
			return domainError{store.ErrNotFound}
		}
		return getValue(txn, resultKey(id), func(v []byte) error {
			r, err := store.DecodeResponse(v)
			if err == nil {
				resp = r
			}
			return err
		})
	})
	return resp, err
}

// OperationsIn returns the ids of operations in status (queued or running), oldest first.
func (s *Store) OperationsIn(status store.Status) ([]string, error) {
	prefix := indexPrefix(status)
	var ids []string
	err := s.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			noteRead(txn, it.Item())
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
func (s *Store) ListOperations(scope string, status store.Status, after string, limit int) (ops []*store.Operation, next string, err error) {
	return s.listOperations(scopeIndexKey(scope, ""), status, after, limit)
}

// ListAllOperations is ListOperations across every scope, for operators.
func (s *Store) ListAllOperations(status store.Status, after string, limit int) ([]*store.Operation, string, error) {
	return s.listOperations([]byte(prefixOperation), status, after, limit)
}

// newestFirst opens a reverse iterator over an index whose keys end in ids, at its newest key,
// or at id after when set (the caller skips after itself).
func newestFirst(txn *badger.Txn, prefix []byte, after string) *badger.Iterator {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: true})
	seek := append(append([]byte(nil), prefix...), 0xff)
	if after != "" {
		seek = append(append([]byte(nil), prefix...), after...)
	}
	it.Seek(seek)
	return it
}

// listOperations walks an index whose keys end in operation ids, newest first.
func (s *Store) listOperations(prefix []byte, status store.Status, after string, limit int) ([]*store.Operation, string, error) {
	var ops []*store.Operation
	next := ""
	err := s.view(func(txn *badger.Txn) error {
		it := newestFirst(txn, prefix, after)
		defer it.Close()
		scanned, last := 0, ""
		for ; it.Valid() && len(ops) < limit && scanned < listScanBudget; it.Next() {
			id := string(it.Item().Key()[len(prefix):])
			if id == after {
				continue
			}
			scanned, last = scanned+1, id
			op, err := getOperation(txn, id)
			if errors.Is(err, store.ErrNotFound) {
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

func getOperation(txn *badger.Txn, id string) (*store.Operation, error) {
	var op *store.Operation
	err := getValue(txn, operationKey(id), func(v []byte) (err error) {
		op, err = store.DecodeOperation(v)
		return err
	})
	if op == nil {
		op = new(store.Operation)
	}
	return op, err
}

// putOperation writes op and moves its queue/running index entry from prev's to its own.
func putOperation(txn *badger.Txn, op *store.Operation, prev *store.Status) error {
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
	e := badger.NewEntry(operationKey(op.ID), store.EncodeOperation(op))
	if op.Status.Final() {
		e = e.WithTTL(time.Until(op.ExpiresAt()) + store.TombstoneFor)
	}
	return txn.SetEntry(e)
}

func putRequest(txn *badger.Txn, id string, req *store.Request) error {
	return txn.Set(requestKey(id), store.EncodeRequest(req))
}

// getValue reads key into fn, mapping a missing key to ErrNotFound.
func getValue(txn *badger.Txn, key []byte, fn func([]byte) error) error {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return domainError{store.ErrNotFound}
	}
	if err != nil {
		return err
	}
	noteRead(txn, item)
	return item.Value(fn)
}

// RecordAttempt counts one more upstream attempt of a running operation (a retry); any other
// operation, a final one above all, is returned as it is.
func (s *Store) RecordAttempt(id string) (*store.Operation, error) {
	var out *store.Operation
	err := s.updateIf(func(txn *badger.Txn) (bool, error) {
		op, err := getOperation(txn, id)
		if err != nil {
			return false, err
		}
		out = op
		if op.Status != store.StatusRunning {
			return false, nil
		}
		op.Attempts, op.UpdatedAt = op.Attempts+1, s.now()
		return true, putOperation(txn, op, &op.Status)
	})
	return out, err
}

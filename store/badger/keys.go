package badger

import (
	"errors"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/mulligan-gw/mulligan/store"
)

// ClaimKey atomically claims key for a request whose fingerprint is fp: of any number of
// concurrent callers exactly one gets Claimed. The claim lasts for lease; past it, a crashed
// holder's claim may be taken over. Under a durable store the claim is on disk before it returns.
func (s *Store) ClaimKey(key, fp []byte, lease time.Duration) (store.Claim, error) {
	unlock := s.locks.lock(key)
	defer unlock()
	var claim store.Claim
	if err := s.updateIf(claimKey(s, key, fp, lease, &claim)); err != nil {
		return store.Claim{}, err
	}
	return claim, nil
}

// ClaimKeyEarly is ClaimKey returning once the claim is committed, its fsync started
// (store.EarlyClaimer): the gate calls the upstream while the fsync runs and answers the client
// after it (docs/api.md, "Durability"). A replay, a conflict or a claim in flight is returned
// as ClaimKey returns it, once what it read is durable.
func (s *Store) ClaimKeyEarly(key, fp []byte, lease time.Duration) (store.Claim, func() error, error) {
	unlock := s.locks.lock(key)
	defer unlock()
	var claim store.Claim
	wrote, read, err := s.commit(claimKey(s, key, fp, lease, &claim), nil)
	switch {
	case err != nil:
		return store.Claim{}, nil, err
	case !s.sync:
		return claim, noWait, nil
	case !wrote:
		if err := wrap(s.awaitDurable(read)); err != nil {
			return store.Claim{}, nil, err
		}
		return claim, nil, nil
	}
	synced := s.sh.syncer.start() // covers what it read too
	return claim, func() error { return wrap(<-synced) }, nil
}

func noWait() error { return nil }

// claimKey is the claim's transaction: it sets *claim to what it found or took.
func claimKey(s *Store, key, fp []byte, lease time.Duration, claim *store.Claim) func(txn *badger.Txn) (bool, error) {
	return func(txn *badger.Txn) (bool, error) {
		rec, err := getRecord(txn, key)
		if err != nil {
			return false, err
		}
		now := s.now()
		var answered bool
		if *claim, answered = store.AnswerFor(rec, fp, now); answered {
			return false, nil // a replay or a conflict: nothing written, no fsync
		}
		// Absent, or an in-flight claim whose holder outlived its lease (a crash): take it. The
		// record outlives its lease a little, so a late retry still sees an expired claim.
		rec = &store.Record{State: store.InFlight, Fingerprint: fp, Token: store.NewToken(), ClaimedAt: now, LeaseUntil: now.Add(lease)}
		*claim = store.Claim{Outcome: store.Claimed, Token: rec.Token}
		return true, putRecord(txn, key, rec, lease+time.Minute)
	}
}

// CompleteKey records resp for the key held under token; it replays until expires.
func (s *Store) CompleteKey(key []byte, token string, resp store.Response, expires time.Time) error {
	unlock := s.locks.lock(key)
	defer unlock()
	return s.update(func(txn *badger.Txn) error {
		rec, err := heldRecord(txn, key, token)
		if err != nil {
			return err
		}
		rec.State, rec.Token, rec.LeaseUntil, rec.ExpiresAt = store.Completed, "", time.Time{}, expires
		rec.Response = &resp
		return putRecord(txn, key, rec, time.Until(expires))
	})
}

// ReleaseKey drops the claim held under token, so the next request with the key runs again.
func (s *Store) ReleaseKey(key []byte, token string) error {
	unlock := s.locks.lock(key)
	defer unlock()
	return s.update(func(txn *badger.Txn) error {
		if _, err := heldRecord(txn, key, token); err != nil {
			return err
		}
		return txn.Delete(idempotencyKey(key))
	})
}

// LookupKey returns the record of key, or nil when there is none.
func (s *Store) LookupKey(key []byte) (*store.Record, error) {
	rec, err := read(s, getRecord, key)
	if !rec.Live(s.now()) {
		return nil, err
	}
	return rec, err
}

// EvictKey deletes the record of key whatever its state; it reports whether there was one.
func (s *Store) EvictKey(key []byte) (bool, error) {
	unlock := s.locks.lock(key)
	defer unlock()
	found := false
	err := s.update(func(txn *badger.Txn) error {
		rec, err := getRecord(txn, key)
		if err != nil || rec == nil {
			return err
		}
		found = true
		return txn.Delete(idempotencyKey(key))
	})
	return found, err
}

func heldRecord(txn *badger.Txn, key []byte, token string) (*store.Record, error) {
	rec, err := getRecord(txn, key)
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.State != store.InFlight || rec.Token != token {
		return nil, domainError{store.ErrNotHolder}
	}
	return rec, nil
}

func getRecord(txn *badger.Txn, key []byte) (*store.Record, error) {
	item, err := txn.Get(idempotencyKey(key))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	noteRead(txn, item)
	var rec *store.Record
	err = item.Value(func(v []byte) error {
		var derr error
		rec, derr = store.DecodeRecord(v)
		return derr
	})
	return rec, err
}

func putRecord(txn *badger.Txn, key []byte, rec *store.Record, ttl time.Duration) error {
	v, err := store.EncodeRecord(rec)
	if err != nil {
		return err
	}
	return txn.SetEntry(badger.NewEntry(idempotencyKey(key), v).WithTTL(ttl))
}

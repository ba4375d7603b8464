package store

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// RecordState is where an idempotency record is in its life.
type RecordState uint8

const (
	// InFlight: a request holds the claim and its upstream call has not finished.
	InFlight RecordState = iota + 1
	// Completed: the response is recorded and replays until the record expires.
	Completed
)

// Response is an upstream response as recorded for replay.
type Response struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"-"`
}

// Record is the stored state of one idempotency key.
type Record struct {
	State       RecordState
	Fingerprint []byte
	Token       string
	ClaimedAt   time.Time
	LeaseUntil  time.Time
	ExpiresAt   time.Time
	OperationID string
	Response    *Response
	// Streamed: the response is a recorded event stream; Response holds its status and
	// headers, and its events are read with ReadEvents.
	Streamed bool
}

// ClaimOutcome says what ClaimKey found.
type ClaimOutcome uint8

const (
	// Claimed: the caller now holds the key and must Complete or Release it.
	Claimed ClaimOutcome = iota + 1
	// Replay: the key completed with the same fingerprint; Record.Response replays.
	Replay
	// InProgress: another request holds the key with the same fingerprint.
	InProgress
	// Mismatch: the key is held or completed with a different fingerprint.
	Mismatch
)

// Claim is ClaimKey's answer.
type Claim struct {
	Outcome ClaimOutcome
	// Token identifies the caller's claim (Claimed only); Complete and Release must present it.
	Token string
	// Record is the stored record (Replay, InProgress, Mismatch).
	Record *Record
}

// ErrNotHolder is returned when a claim was lost before its holder completed or released it: an
// idempotency key's (its lease expired and another request took the key over, or it was
// evicted) or a running operation's (Change.Holder: another worker took it over, or it ended).
var ErrNotHolder = errors.New("claim is no longer held")

// ClaimKey atomically claims key for a request whose fingerprint is fp: of any number of
// concurrent callers exactly one gets Claimed. The claim lasts for lease; past it, a crashed
// holder's claim may be taken over. Under a durable store the claim is on disk before it returns.
func (s *Store) ClaimKey(key, fp []byte, lease time.Duration) (Claim, error) {
	unlock := s.locks.lock(key)
	defer unlock()
	var claim Claim
	err := s.updateIf(func(txn *badger.Txn) (bool, error) {
		rec, err := getRecord(txn, key)
		if err != nil {
			return false, err
		}
		now := s.now()
		var answered bool
		if claim, answered = AnswerFor(rec, fp, now); answered {
			return false, nil // a replay or a conflict: nothing written, no fsync
		}
		// Absent, or an in-flight claim whose holder outlived its lease (a crash): take it. The
		// record outlives its lease a little, so a late retry still sees an expired claim.
		rec = &Record{State: InFlight, Fingerprint: fp, Token: NewToken(), ClaimedAt: now, LeaseUntil: now.Add(lease)}
		claim = Claim{Outcome: Claimed, Token: rec.Token}
		return true, putRecord(txn, key, rec, lease+time.Minute)
	})
	if err != nil {
		return Claim{}, err
	}
	return claim, nil
}

// AnswerFor is the outcome for a request with fingerprint fp when rec is the key's record,
// unless the request may claim the key (no record, one past its replay window, or a holder
// whose lease ran out with the same fingerprint). Every backend decides claims with it.
func AnswerFor(rec *Record, fp []byte, now time.Time) (Claim, bool) {
	switch {
	case !rec.Live(now):
		return Claim{}, false
	case !bytes.Equal(rec.Fingerprint, fp):
		return Claim{Outcome: Mismatch, Record: rec}, true
	case rec.State == Completed:
		return Claim{Outcome: Replay, Record: rec}, true
	case now.Before(rec.LeaseUntil):
		return Claim{Outcome: InProgress, Record: rec}, true
	}
	return Claim{}, false
}

// Live reports whether rec still counts at now: a completed record replays until it expires.
// Past that it reads as absent, whether or not the backend has removed it yet.
func (rec *Record) Live(now time.Time) bool {
	return rec != nil && (rec.State != Completed || rec.ExpiresAt.IsZero() || now.Before(rec.ExpiresAt))
}

// CompleteKey records resp for the key held under token; it replays until expires.
func (s *Store) CompleteKey(key []byte, token string, resp Response, expires time.Time) error {
	unlock := s.locks.lock(key)
	defer unlock()
	return s.update(func(txn *badger.Txn) error {
		rec, err := heldRecord(txn, key, token)
		if err != nil {
			return err
		}
		rec.State, rec.Token, rec.LeaseUntil, rec.ExpiresAt = Completed, "", time.Time{}, expires
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
func (s *Store) LookupKey(key []byte) (*Record, error) {
	var rec *Record
	err := s.view(func(txn *badger.Txn) error {
		var err error
		rec, err = getRecord(txn, key)
		return err
	})
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

func heldRecord(txn *badger.Txn, key []byte, token string) (*Record, error) {
	rec, err := getRecord(txn, key)
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.State != InFlight || rec.Token != token {
		return nil, domainError{ErrNotHolder}
	}
	return rec, nil
}

func getRecord(txn *badger.Txn, key []byte) (*Record, error) {
	item, err := txn.Get(idempotencyKey(key))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec *Record
	err = item.Value(func(v []byte) error {
		var derr error
		rec, derr = decodeRecord(v)
		return derr
	})
	return rec, err
}

func putRecord(txn *badger.Txn, key []byte, rec *Record, ttl time.Duration) error {
	v, err := encodeRecord(rec)
	if err != nil {
		return err
	}
	return txn.SetEntry(badger.NewEntry(idempotencyKey(key), v).WithTTL(ttl))
}

func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

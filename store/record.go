package store

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"time"
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

// NewToken returns a fresh random token: 128 bits, hex.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

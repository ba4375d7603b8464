// Package store keeps everything Mulligan must not lose: idempotency records, operations, their
// requests and results, and the webhook outbox. It names the storage seam (Backend) and holds
// what every backend shares: the types, the decisions (AnswerFor, the state machine, the outbox
// steps) and the codecs. Each backend is a package behind the seam: store/badger (one process,
// one directory) and store/postgres (many replicas as one) (docs/backends.md).
package store

import (
	"errors"
	"fmt"
	"time"
)

// Backend is everything the gateway keeps durably, named for what its callers need. Badger
// (store/badger: one process, one directory) and PostgreSQL (many replicas acting as
// one) implement it, and one behaviour suite runs against both. Decisions (the state machine in
// status.go, what a claim answers in AnswerFor, what to record) live once, outside the
// backends; a backend stores, fences and finds.
type Backend interface {
	Keys
	Operations
	Queue
	Outbox
	StreamRecorder
	Batches

	// Ping reports whether the storage answers. It writes nothing: a readiness probe is not a
	// write load.
	Ping() error
	// Size reports the storage's size in bytes, as well as the backend can tell.
	Size() int64
	// Close releases this handle.
	Close() error
}

// Keys are the idempotency records: claim once, complete or release, replay.
type Keys interface {
	// ClaimKey atomically claims key for a request whose fingerprint is fp: of any number of
	// concurrent callers, across every replica, exactly one gets Claimed. The claim lasts for
	// lease; past it, a crashed holder's claim may be taken over.
	ClaimKey(key, fp []byte, lease time.Duration) (Claim, error)
	// CompleteKey records resp for the key held under token; it replays until expires. A holder
	// whose claim was taken over gets ErrNotHolder and changes nothing.
	CompleteKey(key []byte, token string, resp Response, expires time.Time) error
	// ReleaseKey drops the claim held under token, so the next request with the key runs again.
	ReleaseKey(key []byte, token string) error
	// LookupKey returns the record of key, or nil when there is none.
	LookupKey(key []byte) (*Record, error)
	// EvictKey deletes the record of key whatever its state; it reports whether there was one.
	EvictKey(key []byte) (bool, error)
}

// EarlyClaimer is a Keys whose claim can be committed before it is durable: Badger's, where
// durability is a group fsync after the commit. On PostgreSQL the commit is the flush that makes
// a claim seen by the other replicas, so it has nothing to overlap and does not implement it.
type EarlyClaimer interface {
	// ClaimKeyEarly is ClaimKey returning as soon as a claim is committed, and seen by every
	// other claim of the key, with the fsync that makes it durable started: durable blocks until
	// that fsync is done (at once under durability relaxed). Call durable once, and answer the
	// client only after it (docs/api.md, "Durability"). An outcome other than Claimed is
	// returned as ClaimKey returns it, once what it read is durable; durable is for a claim only.
	ClaimKeyEarly(key, fp []byte, lease time.Duration) (claim Claim, durable func() error, err error)
}

// Operations are the operation resources, their stored requests and results.
type Operations interface {
	// AcceptOperation durably stores op (queued, or running for a call converted after it
	// started) and the request it will send, and completes the key (if any) with the 202 answer,
	// in one transaction. With a key that already has a record (and no token), nothing is stored
	// and the claim outcome is returned instead.
	AcceptOperation(op *Operation, req *Request, key *KeyAccept) (Claim, error)
	// Transition moves operation id along the state machine (ErrIllegalTransition otherwise),
	// bumping its version, storing the result with a final status and the announcer's event in
	// the same transaction. Change.Holder fences it to the replica that holds the operation.
	Transition(id string, c Change) (*Operation, error)
	// RequestCancel marks a queued or running operation as asked to stop; the replica running it
	// learns of it when it renews its lease (RenewLeases).
	RequestCancel(id string, at time.Time) (*Operation, error)
	// RecordAttempt counts one more upstream attempt of a running operation; a final operation
	// is left as it is.
	RecordAttempt(id string) (*Operation, error)
	// GetOperation returns operation id, or ErrNotFound.
	GetOperation(id string) (*Operation, error)
	// LoadRequest returns the stored request of a queued or running operation.
	LoadRequest(id string) (*Request, error)
	// LoadResult returns the stored upstream response of a final operation, or ErrNotFound.
	LoadResult(id string) (*Response, error)
	// ListOperations returns scope's operations newest first, after the id `after`, optionally
	// only those in status, at most limit; next is the cursor for the rest ("" at the end).
	ListOperations(scope string, status Status, after string, limit int) (ops []*Operation, next string, err error)
	// ListAllOperations is ListOperations across every scope, for operators.
	ListAllOperations(status Status, after string, limit int) ([]*Operation, string, error)
}

// Queue is how replicas share the work: any replica takes any queued operation, holds it by a
// lease it renews, and loses it to the others when it falls silent.
type Queue interface {
	// ClaimNext moves the next queued operation in the capacity order to running, held by worker
	// until now+lease (Operation.Holder, Operation.LeaseUntil), and returns it; nil when none is
	// queued, or when each candidate was held by another transaction at that moment (the caller
	// looks again at its next wake-up). The order: effective urgency (EffectiveUrgency: urgency raised by waiting, one level
	// per AgingStep), then the lanes with queued work take turns (the one served least recently
	// first), then within a lane the caller's own urgency (OwnUrgency), then oldest first.
	// Operations whose QueueDeadline has passed are not claimed. No
	// operation is held by two workers at once.
	ClaimNext(worker string, lease time.Duration) (*Operation, error)
	// NextQueued returns the operation ClaimNext would claim now, left queued; nil when none
	// is. Under capacity the runner looks at it to take a seat in its place before it claims
	// (docs/capacity.md, "Waiting is not running").
	NextQueued() (*Operation, error)
	// ClaimQueued moves queued operation id to running, held by worker until now+lease, as
	// ClaimNext would were it next (its scope takes its turn); nil when it is no longer queued,
	// is held by another claimer, or its QueueDeadline has passed.
	ClaimQueued(id, worker string, lease time.Duration) (*Operation, error)
	// StaleQueued returns up to limit queued operations whose QueueDeadline is before now.
	StaleQueued(now time.Time, limit int) ([]*Operation, error)
	// QueuePosition estimates how many queued operations will be claimed before id (0 = next).
	QueuePosition(id string) (int, error)
	// QueuedByUrgency counts queued operations by their stored urgency.
	QueuedByUrgency() ([8]int, error)
	// RenewLeases extends worker's leases on the running operations ids. It reports which of
	// them were asked to cancel (by any replica) and which worker no longer holds (taken over
	// or finished elsewhere): the runner stops both.
	RenewLeases(worker string, ids []string, lease time.Duration) (Renewal, error)
	// ExpiredLeases returns up to limit running operations whose holder's lease ran out: their
	// replica died (on Badger, one process owns the directory, so operations left running by a
	// previous process are expired at once). The caller decides what becomes of each (requeue, WORKER_LOST, canceled) and
	// applies it with a Transition guarded by Change.Holder and Change.LeaseExpired.
	ExpiredLeases(limit int) ([]*Operation, error)
	// ActiveCount counts a scope's queued and running operations (admission per scope).
	ActiveCount(scope string) (int, error)
	// QueueStats counts queued and running operations across the store, batch lines left out:
	// they wait behind everything (urgency 7, a line window per batch) and must not fill the
	// `queue` limit nor readiness for every tenant (docs/batches.md).
	QueueStats() (queued, running int, err error)
	// Wakeups receives when another process may have queued work or asked for a cancel; nil
	// when the backend has no such signal, and callers poll.
	Wakeups() <-chan struct{}
}

// Renewal is what RenewLeases found.
type Renewal struct {
	// CancelRequested are held operations that were asked to cancel.
	CancelRequested []string
	// Lost are operations the worker no longer holds.
	Lost []string
}

// Outbox is the durable list of webhook events and what became of each delivery.
type Outbox interface {
	// SetAnnouncer installs the function whose event is written with each status change.
	SetAnnouncer(a Announcer)
	// DueEvents returns up to limit pending events due between from and now, soonest first.
	DueEvents(from, now time.Time, limit int) ([]Due, error)
	// NextDue reports when the soonest pending event due at or after from is due (zero: none).
	NextDue(from time.Time) (time.Time, error)
	// ClaimEvent takes pending, due event id for delivery by worker until now+lease, and returns
	// it; nil when it is not pending, not due, or held by another worker. Each event is
	// delivered by one replica at a time.
	ClaimEvent(id, worker string, lease time.Duration) (*Event, error)
	// MarkDelivered records a delivery the receiver acknowledged: the event is never sent again.
	MarkDelivered(id string, a Attempt) error
	// Reschedule puts a pending event back in the schedule, due at next, with the attempt's
	// outcome (an uncharged wait keeps Attempt.Attempts at the event's count).
	Reschedule(id string, next time.Time, a Attempt) error
	// DeadLetter moves a pending event to the dead letters, with why.
	DeadLetter(id, reason string, a Attempt) error
	// Redeliver moves a dead letter back to pending, due at `at`, with a fresh attempt budget and
	// a fresh max_age counted from `at` (Event.AgeFrom). Other states are returned unchanged.
	Redeliver(id string, at time.Time) (*Event, error)
	// GetEvent returns event id, or ErrNotFound.
	GetEvent(id string) (*Event, error)
	// DeadLetters returns up to limit dead letters, oldest id first, after `after`.
	DeadLetters(after string, limit int) ([]*Event, error)
	// CountEvents counts pending and dead-lettered events. Every /metrics scrape calls it, so
	// it must not walk the events.
	CountEvents() (pending, dead int, err error)
	// SetEndpointState records an endpoint's lasting state (disabled after a 410).
	SetEndpointState(name string, st EndpointState) error
	// GetEndpointState returns an endpoint's state (the zero state when none was recorded).
	GetEndpointState(name string) (EndpointState, error)
	// RescheduleEndpoint makes every pending event of endpoint due at `at`; it returns how many.
	RescheduleEndpoint(endpoint string, at time.Time) (int, error)
}

// Attempt is the outcome of one delivery attempt, as the outbox keeps it.
type Attempt struct {
	// Attempts is the event's attempt count after this attempt.
	Attempts int
	// At is when the attempt ended.
	At time.Time
	// Status is the receiver's HTTP status, 0 when none came.
	Status int
	// Error says what went wrong, "" when nothing did.
	Error string
}

// ErrUnavailable wraps every failure of the underlying database. Callers answer it with
// 503 STORAGE_UNAVAILABLE: the request may be retried once storage is back.
var ErrUnavailable = errors.New("storage unavailable")

// ErrClosed is returned by calls made on a Store after Close.
var ErrClosed = fmt.Errorf("%w: store is closed", ErrUnavailable)

// An Answer is an error a backend's transaction returns as the store's answer (ErrNotFound,
// ErrNotHolder, an update function's own error...), not as a failure of the database: each
// backend has its own marker type, with this method returning the answer.
type Answer interface {
	error
	StoreAnswer() error
}

// Unavailable is how both backends return a transaction's error: nil stays nil, an Answer is
// unwrapped, and any other failure is wrapped in ErrUnavailable (callers answer 503
// STORAGE_UNAVAILABLE) unless it already is one.
func Unavailable(err error) error {
	var a Answer
	switch {
	case err == nil:
		return nil
	case errors.As(err, &a):
		return a.StoreAnswer()
	case errors.Is(err, ErrUnavailable):
		return err
	default:
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
}

// Logger receives Badger's own log lines. Its method set is Badger's, so zap's sugared logger
// and the standard library's adapters fit.
type Logger interface {
	Errorf(string, ...any)
	Warningf(string, ...any)
	Infof(string, ...any)
	Debugf(string, ...any)
}

package store

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"
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
	// Lift is how many levels more urgent than Urgency the caller asked for this work: it orders
	// the work of the operation's own lane (OwnUrgency), never its place against other lanes
	// (docs/capacity.md, "The order"). 0 for most: a caller's Priority above the default that
	// counts for its own work only, unlike a trusted class's.
	Lift int `json:"lift,omitempty"`
	// FairKey is the fairness key its seat is shared by when it is not the scope
	// (docs/capacity.md, "Fairness"), and Weight the key's weight; zero values: the scope, 1.
	FairKey string  `json:"fair_key,omitempty"`
	Weight  float64 `json:"weight,omitempty"`
	// Charged is the slot time, in microseconds, the claim that started the operation charged
	// its lane's turn in the durable queue before its run was measured (LaneStart), ChargedBand
	// 1 + the band it was claimed in, and ChargedNewcomer whether the claim charged that band's
	// newcomers' turn too; while it runs past its charge the turns count the excess, and the end
	// of its run corrects them by the time it ran. Zero: not charged (claimed by an older
	// release, or never from the queue).
	// NewcomersCharged is what the claim charged the newcomers' turn: Charged, or 0 when
	// another claim held the newcomers' row (PostgreSQL), whose run then counts there whole.
	Charged          int64 `json:"charged,omitempty"`
	ChargedBand      int   `json:"charged_band,omitempty"`
	ChargedNewcomer  bool  `json:"charged_newcomer,omitempty"`
	NewcomersCharged int64 `json:"newcomers_charged,omitempty"`
	// QueueDeadline is when a still-queued operation stops being worth running: it fails
	// QUEUE_TIMEOUT without reaching the upstream. Zero: no deadline.
	QueueDeadline time.Time `json:"queue_deadline,omitzero"`
	// ScopeLimit, when above 0, makes AcceptOperation refuse the operation with ErrScopeFull
	// while its scope already has that many queued or running (async max_per_scope); the count
	// and the write are one step per scope, on every replica. Not stored.
	ScopeLimit int `json:"-"`
	// Batch tags a batch's line operation (docs/batches.md); nil for every other operation.
	Batch *BatchLine `json:"batch,omitempty"`
	// Kind is "response" for a background response of the Responses API (docs/responses.md),
	// empty for every other operation.
	Kind string `json:"kind,omitempty"`
	// Echo is, for a background response, the request's fields its response object repeats
	// (model, instructions, metadata...), compact JSON; nil otherwise.
	Echo []byte `json:"echo,omitempty"`
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
	// ErrScopeFull answers AcceptOperation when the operation's scope is at its ScopeLimit.
	ErrScopeFull = errors.New("the scope has its limit of active operations")
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
	// Charged, ChargedBand and ChargedNewcomer, on a claim (To running), are what the claim
	// charged (Operation.Charged): set by the backend that claims.
	Charged          int64
	ChargedBand      int
	ChargedNewcomer  bool
	NewcomersCharged int64
	// From, when set, applies the change only while the operation is still in status From
	// (ErrIllegalTransition otherwise), checked in the change's own transaction: a batch's cut
	// of a line it read as queued never cancels one a runner claimed in between.
	From Status
}

// ClaimMustBeDurable reports whether a claim of op (its move to running) must be on disk before
// its upstream call (durability sync), on a store whose runner dies with the machine that
// holds the data (Badger; PostgreSQL can crash alone, and syncs every claim). It must under
// on_crash fail, where a crash must fail op WORKER_LOST rather than call the upstream twice,
// and when op's operation.running event goes out, so that no receiver hears of a start the
// store then forgets. Otherwise a claim lost with the machine leaves op queued, and it runs
// again, as the takeover of a claim kept would have run it; the fsync would buy nothing but
// the count of that attempt. The final write's fsync covers the claim (docs/api.md, "How
// operations run").
func ClaimMustBeDurable(op *Operation) bool {
	return op != nil && op.Exec != nil && (op.Exec.OnCrash == "fail" || slices.Contains(op.Exec.Events, "operation.running"))
}

// Apply makes the state machine's bookkeeping of c on op, whatever the backend: the status,
// the version, the start and finish times, the attempt count, the error, the result's
// description, and the holder that a move out of running drops. The caller has checked
// CanChange.
func Apply(op *Operation, c Change, at time.Time) {
	op.Status, op.Version, op.UpdatedAt = c.To, op.Version+1, at
	switch c.To {
	case StatusRunning:
		op.StartedAt, op.Attempts = at, op.Attempts+1
		op.Charged, op.ChargedBand, op.ChargedNewcomer, op.NewcomersCharged = c.Charged, c.ChargedBand, c.ChargedNewcomer, c.NewcomersCharged
	case StatusQueued:
		// A requeued operation (takeover, graceful stop, storage trouble) may already have
		// reached the upstream: its queue deadline bounded the first wait only, so it is
		// dropped here, for every backend's claim filter and stale sweep at once.
		op.StartedAt, op.QueueDeadline = time.Time{}, time.Time{}
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

// Package opview is the one JSON form of an async operation: what GET answers, lists hold,
// webhook events carry, and the 202 body (docs/api.md).
package opview

import (
	"bytes"
	"encoding/json"
	"mime"
	"time"

	"github.com/mulligan-gw/mulligan/internal/fingerprint"

	"github.com/mulligan-gw/mulligan/store"
)

// InlineBodyLimit is the largest JSON result shown inline in an operation; larger ones, and
// non-JSON ones, are served by links.result.
const InlineBodyLimit = 1 << 20

// View is the one JSON form of an operation: GET answers it, lists hold it, webhook
// events carry it.
type View struct {
	OperationID    string          `json:"operation_id"`
	Status         store.Status    `json:"status"`
	Done           bool            `json:"done"`
	Version        int64           `json:"version"`
	Type           string          `json:"type"`
	Method         string          `json:"method"`
	Path           string          `json:"path"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
	SubmittedAt    time.Time       `json:"submitted_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	// RetryAfter is the polling hint in seconds while the operation is not final (the
	// Retry-After header's value, for clients that read only the body).
	RetryAfter        *int       `json:"retry_after,omitempty"`
	StartedAt         *time.Time `json:"started_at"`
	FinishedAt        *time.Time `json:"finished_at"`
	ExpiresAt         *time.Time `json:"expires_at"`
	CancelRequestedAt *time.Time `json:"cancel_requested_at,omitempty"`
	Attempts          int        `json:"attempts"`
	// Urgency is the RFC 9218 urgency the operation waits at (docs/capacity.md).
	Urgency int `json:"urgency"`
	// QueuePosition estimates, while the operation is queued, how many queued operations will
	// be claimed before it (0: next), when the storage can tell.
	QueuePosition *int `json:"queue_position,omitempty"`
	// QueueDeadline is when the operation fails QUEUE_TIMEOUT if still queued.
	QueueDeadline *time.Time `json:"queue_deadline,omitempty"`
	Progress      *Progress  `json:"progress,omitempty"`
	Response      *Response  `json:"response"`
	Error         *Error     `json:"error"`
	Links         Links      `json:"links"`
}

// Response is a final operation's answer: its status, its type and, when it is JSON and small
// enough, its body.
type Response struct {
	Status      int             `json:"status"`
	ContentType string          `json:"content_type,omitempty"`
	Body        json.RawMessage `json:"body,omitempty"`
}

// Error is why an operation failed, from the error catalogue.
type Error struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
}

// Links are an operation's URLs: itself, its cancel and its result.
type Links struct {
	Self   string `json:"self"`
	Cancel string `json:"cancel"`
	Result string `json:"result"`
}

// Accepted is the 202 body.
type Accepted struct {
	OperationID    string       `json:"operation_id"`
	Status         store.Status `json:"status"`
	Done           bool         `json:"done"`
	StatusURL      string       `json:"status_url"`
	SubmittedAt    time.Time    `json:"submitted_at"`
	IdempotencyKey string       `json:"idempotency_key,omitempty"`
	// WebhookRegistered says whether the operation's events go to a webhook endpoint.
	WebhookRegistered bool  `json:"webhook_registered"`
	Links             Links `json:"links"`
}

// LinksFor is the links of operation id served under prefix.
func LinksFor(prefix, id string) Links {
	self := prefix + "/" + id
	return Links{Self: self, Cancel: self + "/cancel", Result: self + "/result"}
}

// Of renders op as seen at now; result is its stored response when loaded (final only).
func Of(prefix string, op *store.Operation, result *store.Response, now time.Time) View {
	op = op.As(now)
	v := View{
		OperationID: op.ID, Status: op.Status, Done: op.Status.Final(), Version: op.Version,
		Type: typeOf(op), Method: op.Method, Path: op.Path, IdempotencyKey: op.IdempotencyKey, Metadata: op.Metadata,
		SubmittedAt: op.SubmittedAt.UTC(), UpdatedAt: updatedAt(op), StartedAt: timePtr(op.StartedAt), FinishedAt: timePtr(op.FinishedAt),
		ExpiresAt: timePtr(op.ExpiresAt()), CancelRequestedAt: timePtr(op.CancelRequestedAt),
		Attempts: op.Attempts, Links: LinksFor(prefix, op.ID), Urgency: op.Urgency,
	}
	if op.Status == store.StatusQueued {
		v.QueueDeadline = timePtr(op.QueueDeadline)
	}
	if !op.Status.Final() {
		secs := int(PollAfter / time.Second)
		v.RetryAfter = &secs
	}
	if op.Error != nil {
		v.Error = &Error{Code: op.Error.Code, Message: op.Error.Message, Retryable: op.Error.Retryable}
	}
	if op.Result != nil && op.Status.Final() {
		v.Response = &Response{Status: op.Result.Status, ContentType: op.Result.ContentType}
		if result != nil && inlineJSON(op.Result.ContentType, result.Body) {
			v.Response.Body = compactJSON(result.Body)
		}
	}
	return v
}

// typeOf is the operation's kind; operations stored before types existed read as their path.
func typeOf(op *store.Operation) string {
	if op.Type != "" {
		return op.Type
	}
	return op.Path
}

// updatedAt is when op last changed: the stored time, or (for an operation stored without one)
// the latest of its timestamps. An expired operation changed when its retention ran out.
func updatedAt(op *store.Operation) time.Time {
	if op.Status == store.StatusExpired {
		return op.ExpiresAt().UTC()
	}
	t := op.UpdatedAt
	for _, u := range []time.Time{op.SubmittedAt, op.StartedAt, op.FinishedAt, op.CancelRequestedAt} {
		if u.After(t) {
			t = u
		}
	}
	return t.UTC()
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func inlineJSON(contentType string, body []byte) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	return fingerprint.IsJSON(mt) && len(body) <= InlineBodyLimit && json.Valid(body)
}

func compactJSON(b []byte) json.RawMessage {
	var out bytes.Buffer
	if json.Compact(&out, b) != nil {
		return nil
	}
	return out.Bytes()
}

// PollAfter is the Retry-After hint for an operation that is not final yet.
const PollAfter = 2 * time.Second

// Progress is a running operation's progress: the events and bytes of its streamed answer so
// far.
type Progress struct {
	Events int   `json:"events"`
	Bytes  int64 `json:"bytes"`
}

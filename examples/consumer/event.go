package consumer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Event types Mulligan sends (docs/webhooks.md, Events). Act on Operation.Status rather
// than on the type: an event refreshed from the gateway carries the
// operation's newer state under the type it was delivered with.
const (
	EventOperationRunning   = "operation.running"
	EventOperationSucceeded = "operation.succeeded"
	EventOperationFailed    = "operation.failed"
	EventOperationCanceled  = "operation.canceled"
)

// Event is one webhook delivery's body. Fields Mulligan adds later are
// ignored, as the contract requires of consumers.
type Event struct {
	// EventID identifies the event; it equals the webhook-id header.
	EventID string `json:"event_id"`
	// EventType is one of the EventOperation* constants, or a newer type.
	EventType string `json:"event_type"`
	// EventVersion is the payload format version, "1.0" today.
	EventVersion string `json:"event_version"`
	// OccurredAt is when the status change happened.
	OccurredAt time.Time `json:"occurred_at"`
	// DeliveryAttempt counts the gateway's attempts to deliver this event.
	DeliveryAttempt int `json:"delivery_attempt"`
	// Operation is the operation as GET {operations}/{id} returns it.
	Operation Operation `json:"operation"`
	// Refreshed reports that Operation is not the delivered one but a newer
	// state fetched from the gateway, because the delivered one could not be
	// trusted to be the latest.
	Refreshed bool `json:"-"`
}

// Operation is the gateway's operation resource, in the fields a consumer
// usually needs.
type Operation struct {
	// OperationID is the op_... id.
	OperationID string `json:"operation_id"`
	// Status is queued, running, succeeded, failed, canceled or expired.
	Status string `json:"status"`
	// Done is true once Status is final.
	Done bool `json:"done"`
	// Version grows with every transition; it orders events.
	Version int64 `json:"version"`
	// Method and Path are those of the request the operation runs.
	Method string `json:"method"`
	Path   string `json:"path"`
	// IdempotencyKey is the client's Idempotency-Key, when it sent one.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// SubmittedAt is when the gateway accepted the request.
	SubmittedAt time.Time `json:"submitted_at"`
	// FinishedAt is when the operation became final, nil before.
	FinishedAt *time.Time `json:"finished_at"`
	// ExpiresAt is until when a final operation and its result are kept
	// (the gateway's retention), nil before it is final.
	ExpiresAt *time.Time `json:"expires_at"`
	// Response is the upstream's answer once final, nil before.
	Response *Response `json:"response"`
	// Error explains a failed or canceled operation, nil otherwise.
	Error *OperationError `json:"error"`
	// Links locate the operation on the gateway.
	Links Links `json:"links"`
}

// Response is the upstream response recorded for a final operation.
type Response struct {
	// Status is the upstream HTTP status.
	Status int `json:"status"`
	// ContentType is the upstream Content-Type.
	ContentType string `json:"content_type,omitempty"`
	// Body is the upstream JSON when small enough to inline; otherwise
	// empty, and Links.Result serves it.
	Body json.RawMessage `json:"body,omitempty"`
}

// OperationError is a failed operation's error object (docs/api.md, The operation).
type OperationError struct {
	// Code is stable for machines, such as UPSTREAM_UNAVAILABLE.
	Code string `json:"code"`
	// Message is for people.
	Message string `json:"message"`
	// Retryable says whether submitting the request again may succeed.
	Retryable bool `json:"retryable"`
}

// Links are paths on the gateway, relative to its origin.
type Links struct {
	// Self is the operation resource: GET it for the current state.
	Self string `json:"self"`
	// Cancel cancels the operation.
	Cancel string `json:"cancel"`
	// Result serves the upstream response exactly as sent.
	Result string `json:"result"`
}

// errMalformedEvent marks a verified body that is not a usable event.
var errMalformedEvent = errors.New("malformed event")

// parseEvent decodes a verified body and checks the fields ordering and
// dedupe depend on.
func parseEvent(body []byte) (Event, error) {
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return Event{}, fmt.Errorf("%w: %v", errMalformedEvent, err)
	}
	switch {
	case ev.EventType == "":
		return Event{}, fmt.Errorf("%w: no event_type", errMalformedEvent)
	case ev.Operation.OperationID == "":
		return Event{}, fmt.Errorf("%w: no operation.operation_id", errMalformedEvent)
	case ev.Operation.Version <= 0:
		return Event{}, fmt.Errorf("%w: operation.version must be positive", errMalformedEvent)
	}
	return ev, nil
}

// responseEvent reports whether a verified body is an event of the Responses API, in
// OpenAI's format ({"object":"event","type":"response.completed","data":{"id":"resp_..."}}),
// and its type.
func responseEvent(body []byte) (string, bool) {
	var ev struct {
		Object string `json:"object"`
		Type   string `json:"type"`
		Data   struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &ev) != nil || ev.Object != "event" || !strings.HasPrefix(ev.Type, "response.") || ev.Data.ID == "" {
		return "", false
	}
	return ev.Type, true
}

package store

import (
	"encoding/json"
	"time"
)

// EventState is where a webhook event is in the outbox.
type EventState string

// The outbox states: pending until delivered or dead-lettered.
const (
	EventPending   EventState = "pending"
	EventDelivered EventState = "delivered"
	EventDead      EventState = "dead"
)

// DeliveredKeptFor is how long a delivered event stays readable, for operators.
const DeliveredKeptFor = 24 * time.Hour

// Event is one webhook event in the durable outbox.
type Event struct {
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	OperationID string          `json:"operation_id"`
	Version     int64           `json:"version"`
	Endpoint    string          `json:"endpoint"`
	URL         string          `json:"url"`
	OccurredAt  time.Time       `json:"occurred_at"`
	Operation   json.RawMessage `json:"operation"`
	State       EventState      `json:"state"`
	Attempts    int             `json:"attempts"`
	NextAttempt time.Time       `json:"next_attempt,omitzero"`
	LastStatus  int             `json:"last_status,omitempty"`
	LastError   string          `json:"last_error,omitempty"`
	DeadReason  string          `json:"dead_reason,omitempty"`
	DeliveredAt time.Time       `json:"delivered_at,omitzero"`
	// AgeFrom is when a redelivered event's max_age starts again (zero: from OccurredAt).
	AgeFrom time.Time `json:"age_from,omitzero"`
	// Traceparent and Tracestate are the operation's W3C Trace Context, sent as headers with
	// every delivery so the consumer's work joins the same trace.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
	// DeadAt is when the event was dead-lettered; dead letters expire a retention after it.
	DeadAt time.Time `json:"dead_at,omitzero"`
}

// AgeStart is when the event's max_age is counted from: its redelivery, else its occurrence.
func (ev *Event) AgeStart() time.Time {
	if ev.AgeFrom.After(ev.OccurredAt) {
		return ev.AgeFrom
	}
	return ev.OccurredAt
}

// Callback is where an operation's events go.
type Callback struct {
	Endpoint string `json:"endpoint"`
	URL      string `json:"url"`
}

// Announcer returns the event that announces op's new status (result is the stored upstream
// response, when the change brings one), or nil when nothing is to be announced. It runs
// inside the transaction of the status change, so no status change is stored without its
// event.
type Announcer func(op *Operation, result *Response) *Event

// PendingEvent is the event the installed announcer a (nil when none is) makes of op's change,
// pending delivery from when it occurred; nil when there is nothing to announce. Both backends
// write it in the change's transaction.
func PendingEvent(a *Announcer, op *Operation, result *Response) *Event {
	if a == nil || *a == nil {
		return nil
	}
	return pending((*a)(op, result))
}

// PendingBatchEvent is PendingEvent for batch b's final status, from the installed batch
// announcer a.
func PendingBatchEvent(a *BatchAnnouncer, b *Batch) *Event {
	if a == nil || *a == nil {
		return nil
	}
	return pending((*a)(b))
}

// pending makes ev, when there is one, pending delivery from when it occurred.
func pending(ev *Event) *Event {
	if ev != nil {
		ev.State, ev.NextAttempt = EventPending, ev.OccurredAt
	}
	return ev
}

// Due is a pending event in the schedule: enough to decide whether to deliver it now.
type Due struct {
	ID       string
	Endpoint string
	At       time.Time
}

// DefaultDeadLetterRetention is how long a dead letter is kept, from its death, when
// Options.DeadLetterRetention is zero: time to notice and redeliver it (the PostgreSQL backend
// keeps them as long).
const DefaultDeadLetterRetention = 30 * 24 * time.Hour

// EndpointState is an endpoint's lasting condition: disabled after a 410 until re-enabled.
type EndpointState struct {
	Disabled   bool      `json:"disabled"`
	DisabledAt time.Time `json:"disabled_at,omitzero"`
	Reason     string    `json:"reason,omitempty"`
}

// Delivered records an acknowledged delivery.
func (ev *Event) Delivered(a Attempt) {
	ev.State, ev.DeliveredAt = EventDelivered, a.At
	ev.setAttempt(a)
}

// Rescheduled puts the event's next attempt at next.
func (ev *Event) Rescheduled(next time.Time, a Attempt) {
	ev.NextAttempt = next
	ev.setAttempt(a)
}

// DeadLettered gives up on the event, saying why; the attempt's time is its time of death, from
// which the dead-letter retention counts.
func (ev *Event) DeadLettered(reason string, a Attempt) {
	ev.State, ev.DeadReason, ev.DeadAt = EventDead, reason, a.At
	ev.setAttempt(a)
}

// Redelivered makes a dead letter pending again, due at `at`, with a fresh attempt budget and a
// fresh max_age counted from `at`.
func (ev *Event) Redelivered(at time.Time) {
	ev.State, ev.NextAttempt, ev.Attempts, ev.DeadReason, ev.AgeFrom, ev.DeadAt = EventPending, at, 0, "", at, time.Time{}
}

// setAttempt copies an attempt's outcome onto the event; a zero Attempts leaves the count.
func (ev *Event) setAttempt(a Attempt) {
	if a.Attempts > 0 {
		ev.Attempts = a.Attempts
	}
	if a.Status != 0 || a.Error != "" {
		ev.LastStatus, ev.LastError = a.Status, a.Error
	}
}

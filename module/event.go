package module

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/internal/batches"
	"github.com/mulligan-gw/mulligan/internal/opview"
	"github.com/mulligan-gw/mulligan/internal/responses"
	"github.com/mulligan-gw/mulligan/store"
)

// A webhook event is built here when an operation's status changes (announce, in the
// transition's own transaction) and rendered here when the courier delivers it (renderEvent).

// eventTypes names the event announcing each status.
var eventTypes = map[store.Status]string{
	store.StatusSucceeded: EventSucceeded, store.StatusFailed: EventFailed,
	store.StatusCanceled: EventCanceled, store.StatusRunning: EventRunning,
}

// announcer is every storage's announcer, its events stamped on clock: the event for op's new
// status, written in the same transaction, when the operation has a callback and its block
// delivers that event type.
func announcer(clock clockwork.Clock) store.Announcer {
	return func(op *store.Operation, result *store.Response) *store.Event { return announce(clock, op, result) }
}

func announce(clock clockwork.Clock, op *store.Operation, result *store.Response) *store.Event {
	if op.Kind == responses.Kind {
		now := clock.Now()
		return responses.Announce(op, result, newID("evt_", now), now)
	}
	typ := eventTypes[op.Status]
	ex := execOf(op)
	if op.Callback == nil || typ == "" || !slices.Contains(ex.Events, typ) {
		return nil
	}
	now := clock.Now()
	payload, err := json.Marshal(opview.Of(ex.Prefix, op, result, now))
	if err != nil {
		return nil
	}
	return &store.Event{
		ID: newID("evt_", now), Type: typ, OperationID: op.ID, Version: op.Version,
		Endpoint: op.Callback.Endpoint, URL: op.Callback.URL, OccurredAt: now, Operation: payload,
		Traceparent: op.Traceparent, Tracestate: op.Tracestate,
	}
}

// eventEnvelope is the body of a delivery (docs/webhooks.md, Events).
type eventEnvelope struct {
	EventID         string          `json:"event_id"`
	EventType       string          `json:"event_type"`
	EventVersion    string          `json:"event_version"`
	OccurredAt      time.Time       `json:"occurred_at"`
	DeliveryAttempt int             `json:"delivery_attempt"`
	Operation       json.RawMessage `json:"operation,omitempty"`
	// Batch is a batch.* event's subject (docs/batches.md), kept in the event's Operation.
	Batch json.RawMessage `json:"batch,omitempty"`
}

func renderEvent(ev *store.Event, attempt int) ([]byte, error) {
	if responses.IsWebhookType(ev.Type) {
		return responses.RenderEvent(ev)
	}
	env := eventEnvelope{EventID: ev.ID, EventType: ev.Type, EventVersion: "1.0",
		OccurredAt: ev.OccurredAt.UTC(), DeliveryAttempt: attempt, Operation: ev.Operation}
	if batches.IsEvent(ev.Type) {
		env.Operation, env.Batch = nil, ev.Operation
	}
	return json.Marshal(env)
}

package runner

import (
	"encoding/json"
	"slices"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/internal/batches"
	"github.com/mulligan-gw/mulligan/internal/ids"
	"github.com/mulligan-gw/mulligan/internal/opview"
	"github.com/mulligan-gw/mulligan/internal/responses"
	"github.com/mulligan-gw/mulligan/store"
)

// A webhook event is built here when an operation's status changes (Announcer, in the
// transition's own transaction) and rendered here when the courier delivers it (RenderEvent).

// The operations' event types (docs/webhooks.md).
const (
	EventSucceeded = "operation.succeeded"
	EventFailed    = "operation.failed"
	EventCanceled  = "operation.canceled"
	EventRunning   = "operation.running"
)

// eventTypes names the event announcing each status.
var eventTypes = map[store.Status]string{
	store.StatusSucceeded: EventSucceeded, store.StatusFailed: EventFailed,
	store.StatusCanceled: EventCanceled, store.StatusRunning: EventRunning,
}

// Announcer is every storage's announcer, its events stamped on clock: the event for op's new
// status, written in the same transaction, when the operation has a callback and its block
// delivers that event type (an operation stored without its execution is run as legacy).
func Announcer(clock clockwork.Clock, legacy store.Execution) store.Announcer {
	return func(op *store.Operation, result *store.Response) *store.Event {
		return announce(clock, legacy, op, result)
	}
}

func announce(clock clockwork.Clock, legacy store.Execution, op *store.Operation, result *store.Response) *store.Event {
	if op.Kind == responses.Kind {
		now := clock.Now()
		return responses.Announce(op, result, ids.New("evt_", now), now)
	}
	typ := eventTypes[op.Status]
	ex := ExecOf(op, legacy)
	if op.Callback == nil || typ == "" || !slices.Contains(ex.Events, typ) {
		return nil
	}
	now := clock.Now()
	payload, err := json.Marshal(opview.Of(ex.Prefix, op, result, now))
	if err != nil {
		return nil
	}
	return &store.Event{
		ID: ids.New("evt_", now), Type: typ, OperationID: op.ID, Version: op.Version,
		Endpoint: op.Callback.Endpoint, URL: op.Callback.URL, OccurredAt: now, Operation: payload,
		Traceparent: op.Traceparent, Tracestate: op.Tracestate,
	}
}

// RenderEvent is the body of ev's delivery attempt: the Responses API's own webhook, or the
// envelope of an operation's or a batch's event.
func RenderEvent(ev *store.Event, attempt int) ([]byte, error) {
	if responses.IsWebhookType(ev.Type) {
		return responses.RenderEvent(ev)
	}
	env := opview.Envelope{EventID: ev.ID, EventType: ev.Type, EventVersion: "1.0",
		OccurredAt: ev.OccurredAt.UTC(), DeliveryAttempt: attempt, Operation: ev.Operation}
	if batches.IsEvent(ev.Type) {
		env.Operation, env.Batch = nil, ev.Operation
	}
	return json.Marshal(env)
}

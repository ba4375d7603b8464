package module

import (
	"encoding/json"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/internal/responses"
	"github.com/mulligan-gw/mulligan/store"
)

// A background response's webhooks are OpenAI's (docs/responses.md): the event names the
// response's final status, and its body is {"id":"evt_...","object":"event","type":...,
// "created_at":...,"data":{"id":"resp_..."}}, signed and delivered from the outbox as every
// event is.

// announceResponse is the event of a response's move to a final status, written in the
// transition's own transaction; nil for other moves or without a callback.
func announceResponse(clock clockwork.Clock, op *store.Operation, result *store.Response) *store.Event {
	if op.Callback == nil || !op.Status.Final() {
		return nil
	}
	status := responses.Cancelled
	if op.Status != store.StatusCanceled {
		status = finalObject(op, result, func(s string) responses.Object {
			return responses.Base(op.ID, op.SubmittedAt.Unix(), s, op.Echo)
		}).Status()
	}
	typ := responses.WebhookType(status)
	if typ == "" {
		return nil
	}
	now := clock.Now()
	data, _ := json.Marshal(map[string]string{"id": op.ID})
	return &store.Event{
		ID: newID("evt_", now), Type: typ, OperationID: op.ID, Version: op.Version,
		Endpoint: op.Callback.Endpoint, URL: op.Callback.URL, OccurredAt: now, Operation: data,
		Traceparent: op.Traceparent, Tracestate: op.Tracestate,
	}
}

// responseEnvelope is the body of a response event's delivery, OpenAI's.
type responseEnvelope struct {
	ID        string          `json:"id"`
	Object    string          `json:"object"`
	Type      string          `json:"type"`
	CreatedAt int64           `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

func renderResponseEvent(ev *store.Event) ([]byte, error) {
	return json.Marshal(responseEnvelope{ID: ev.ID, Object: "event", Type: ev.Type, CreatedAt: ev.OccurredAt.Unix(), Data: ev.Operation})
}

package responses

import (
	"encoding/json"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// A background response's webhooks are OpenAI's (docs/responses.md): the event names the
// response's final status, and its body is {"id":"evt_...","object":"event","type":...,
// "created_at":...,"data":{"id":"resp_..."}}, signed and delivered from the outbox as every
// event is.

// WebhookTypes are the events a background response with a callback sends.
var WebhookTypes = []string{"response.completed", "response.failed", "response.cancelled", "response.incomplete"}

// Announce is the event of a response's move to a final status, whose recorded answer is
// result, to be written in the transition's own transaction, at now and with the event id
// given; nil for other moves or without a callback.
func Announce(op *store.Operation, result *store.Response, id string, now time.Time) *store.Event {
	if op.Callback == nil || !op.Status.Final() {
		return nil
	}
	status := Cancelled
	if op.Status != store.StatusCanceled {
		status = FinalObject(op, result).Status()
	}
	typ := WebhookType(status)
	if typ == "" {
		return nil
	}
	data, _ := json.Marshal(map[string]string{"id": op.ID})
	return &store.Event{
		ID: id, Type: typ, OperationID: op.ID, Version: op.Version,
		Endpoint: op.Callback.Endpoint, URL: op.Callback.URL, OccurredAt: now, Operation: data,
		Traceparent: op.Traceparent, Tracestate: op.Tracestate,
	}
}

// envelope is the body of a response event's delivery, OpenAI's.
type envelope struct {
	ID        string          `json:"id"`
	Object    string          `json:"object"`
	Type      string          `json:"type"`
	CreatedAt int64           `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

// RenderEvent is the body of ev's delivery, a response event written by Announce.
func RenderEvent(ev *store.Event) ([]byte, error) {
	return json.Marshal(envelope{ID: ev.ID, Object: "event", Type: ev.Type, CreatedAt: ev.OccurredAt.Unix(), Data: ev.Operation})
}

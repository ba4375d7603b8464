package module

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// The webhook events of batches (docs/batches.md, docs/webhooks.md).
const (
	EventBatchCompleted = "batch.completed"
	EventBatchFailed    = "batch.failed"
	EventBatchExpired   = "batch.expired"
	EventBatchCancelled = "batch.cancelled"
)

func isBatchEvent(typ string) bool { return strings.HasPrefix(typ, "batch.") }

// batchEventWanted reports whether a block whose `events` are events delivers typ: the batch
// events it names, or, when it names none, every one of them (a batch's callback is asked for
// by the batch's creator, and its final status is what it is for).
func batchEventWanted(events []string, typ string) bool {
	if slices.ContainsFunc(events, isBatchEvent) {
		return slices.Contains(events, typ)
	}
	return true
}

// announceBatch is every storage's batch announcer: the event for b's final status, written in
// the same transaction, when the batch has a callback and its block delivers that event type.
func announceBatch(b *store.Batch) *store.Event {
	typ := "batch." + string(b.Status)
	var events []string
	if b.Exec != nil {
		events = b.Exec.Events
	}
	if b.Callback == nil || !b.Status.Final() || !batchEventWanted(events, typ) {
		return nil
	}
	now := time.Now()
	payload, err := json.Marshal(viewOfBatch(b))
	if err != nil {
		return nil
	}
	return &store.Event{ID: newID("evt_", now), Type: typ, OperationID: b.ID, Version: 1,
		Endpoint: b.Callback.Endpoint, URL: b.Callback.URL, OccurredAt: now, Operation: payload}
}

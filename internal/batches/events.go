package batches

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/store"
)

// The webhook events of batches (docs/batches.md, docs/webhooks.md).
const (
	EventCompleted = "batch.completed"
	EventFailed    = "batch.failed"
	EventExpired   = "batch.expired"
	EventCancelled = "batch.cancelled"
)

// IsEvent reports whether typ is a batch event.
func IsEvent(typ string) bool { return strings.HasPrefix(typ, "batch.") }

// EventWanted reports whether a block whose `events` are events delivers typ: the batch
// events it names, or, when it names none, every one of them (a batch's callback is asked for
// by the batch's creator, and its final status is what it is for).
func EventWanted(events []string, typ string) bool {
	if slices.ContainsFunc(events, IsEvent) {
		return slices.Contains(events, typ)
	}
	return true
}

// Announcer is every storage's batch announcer (store.BatchAnnouncer): the event for b's final
// status, written in the same transaction, when the batch has a callback and its block delivers
// that event type. Events are stamped on clock and named by newID, the gateway's id generator.
func Announcer(clock clockwork.Clock, newID func(prefix string, now time.Time) string) store.BatchAnnouncer {
	return func(b *store.Batch) *store.Event {
		typ := "batch." + string(b.Status)
		var events []string
		if b.Exec != nil {
			events = b.Exec.Events
		}
		if b.Callback == nil || !b.Status.Final() || !EventWanted(events, typ) {
			return nil
		}
		now := clock.Now()
		payload, err := json.Marshal(ViewOf(b))
		if err != nil {
			return nil
		}
		return &store.Event{ID: newID("evt_", now), Type: typ, OperationID: b.ID, Version: 1,
			Endpoint: b.Callback.Endpoint, URL: b.Callback.URL, OccurredAt: now, Operation: payload}
	}
}

package consumer

import "fmt"

// queuedEvent is an accepted event waiting to be handled.
type queuedEvent struct {
	id    string // the webhook-id it was journaled under
	event Event
}

// journalState is what the journal says at start.
type journalState struct {
	seen     map[string]struct{} // every webhook-id ever accepted: the dedupe set
	versions versionTracker      // the latest state processed per operation
	backlog  []queuedEvent       // accepted but not handled, in journal order
}

// replay rebuilds the consumer's state from the journal's records.
func replay(records []record) (journalState, error) {
	state := journalState{seen: map[string]struct{}{}, versions: newVersionTracker()}
	handled := map[string]bool{}
	var received []record
	for _, r := range records {
		switch r.Kind {
		case kindReceived:
			if _, dup := state.seen[r.ID]; !dup {
				state.seen[r.ID] = struct{}{}
				received = append(received, r)
			}
		case kindProcessed:
			handled[r.ID] = true
			if r.Outcome == outcomeProcessed {
				state.versions.record(r.OperationID, r.Version, r.Final)
			}
		}
	}
	for _, r := range received {
		if handled[r.ID] {
			continue
		}
		ev, err := parseEvent(r.Event)
		if err != nil {
			return journalState{}, fmt.Errorf("journaled event %s: %w", r.ID, err)
		}
		state.backlog = append(state.backlog, queuedEvent{id: r.ID, event: ev})
	}
	return state, nil
}

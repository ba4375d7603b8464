package consumer

// opState is the latest state of an operation that was processed.
type opState struct {
	version int64
	final   bool
}

// versionTracker remembers, per operation, the highest version processed.
// Only the queue's goroutine uses it after start, so it needs no lock.
type versionTracker struct {
	known map[string]opState
}

func newVersionTracker() versionTracker {
	return versionTracker{known: map[string]opState{}}
}

// verdict is what to do with an event, judged by its operation's version.
type verdict int

const (
	// apply: the event is the newest state known; process it.
	apply verdict = iota
	// stale: a state at least as new was already processed; ignore it.
	stale
	// askGateway: the event is newer but may not be the latest; GET the
	// operation and process what the gateway says.
	askGateway
)

// judge compares op with what was processed. Deliveries are retried and run
// in parallel, so arrival order means nothing; the version, bumped by every
// transition, is the order.
func (t versionTracker) judge(op Operation) verdict {
	known, seen := t.known[op.OperationID]
	switch {
	case !seen:
		return apply
	case op.Version <= known.version:
		return stale
	case known.final:
		// Final states are final (docs/api.md, Status model); a newer event contradicts
		// that, so believe the gateway rather than the event.
		return askGateway
	case !op.Done && op.Version > known.version+1:
		// A transition was missed: this non-final state may already be
		// superseded. A final event needs no check: nothing supersedes it.
		return askGateway
	}
	return apply
}

// record notes that the operation's state at version was processed.
func (t versionTracker) record(operationID string, version int64, final bool) {
	if known, seen := t.known[operationID]; seen && known.version >= version {
		return
	}
	t.known[operationID] = opState{version: version, final: final}
}

package consumer

import (
	"sync"
)

// work is the queue's goroutine: it handles the backlog replayed from the
// journal, then every newly accepted event, one at a time, until Close.
func (c *Consumer) work(backlog []queuedEvent) {
	defer close(c.workerDone)
	for _, q := range backlog {
		if c.stop.Err() != nil {
			return
		}
		c.handle(q)
	}
	for {
		if c.stop.Err() != nil { // Close wins over a waiting event
			return
		}
		select {
		case <-c.stop.Done():
			return
		case q := <-c.queue:
			c.handle(q)
		}
	}
}

// handle processes one event, or ignores it as stale, and journals which.
func (c *Consumer) handle(q queuedEvent) {
	ev, outcome, ok := c.resolve(q.event)
	if !ok {
		return // closing mid-poll: left in the journal for the next start
	}
	op := ev.Operation
	if outcome == outcomeProcessed {
		c.cfg.Process(ev)
		c.versions.record(op.OperationID, op.Version, op.Done)
	} else {
		c.cfg.Logf("consumer: %s: stale, ignored: %s is at version %d, processed already at or past it",
			q.id, op.OperationID, op.Version)
	}
	marker := record{Kind: kindProcessed, ID: q.id, At: c.cfg.Now().UTC(), Outcome: outcome}
	if outcome == outcomeProcessed {
		marker.OperationID, marker.Version, marker.Final = op.OperationID, op.Version, op.Done
	}
	if err := c.journal.append(marker); err != nil {
		// The event is processed again after a restart: at-least-once.
		c.cfg.Logf("consumer: %s: journaling the processed marker: %v", q.id, err)
	}
	c.pending.done()
}

// resolve decides what to process for ev: ev itself, the operation's state
// fetched from the gateway, or nothing (stale). ok is false when the
// consumer is closing and the event should wait for the next start.
func (c *Consumer) resolve(ev Event) (_ Event, outcome string, ok bool) {
	switch c.versions.judge(ev.Operation) {
	case stale:
		return ev, outcomeStale, true
	case askGateway:
		return c.refresh(ev)
	}
	return ev, outcomeProcessed, true
}

// refresh replaces ev's operation with the gateway's current state. When the
// poll fails the event is processed as delivered: it is authentic and newer
// than anything processed, and a later state arrives as its own event (see
// the package documentation for why the poll is not retried).
func (c *Consumer) refresh(ev Event) (_ Event, outcome string, ok bool) {
	op := ev.Operation
	fresh, err := c.fetchOperation(c.stop, op)
	switch {
	case err != nil && c.stop.Err() != nil:
		return ev, "", false
	case err != nil:
		c.cfg.Logf("consumer: %s: polling %s failed, processing the event as delivered: %v", ev.EventID, op.OperationID, err)
		return ev, outcomeProcessed, true
	case fresh.Version < op.Version:
		c.cfg.Logf("consumer: %s: gateway has %s at version %d, older than the event's %d; processing the event",
			ev.EventID, op.OperationID, fresh.Version, op.Version)
		return ev, outcomeProcessed, true
	}
	c.cfg.Logf("consumer: %s: polled %s: version %d (%s) replaces the event's %d (%s)",
		ev.EventID, op.OperationID, fresh.Version, fresh.Status, op.Version, op.Status)
	ev.Operation, ev.Refreshed = fresh, true
	return ev, outcomeProcessed, true
}

// pendingCount counts accepted events not handled yet, for WaitIdle.
type pendingCount struct {
	mu    sync.Mutex
	n     int
	empty chan struct{} // closed while n == 0
}

func newPendingCount() pendingCount {
	empty := make(chan struct{})
	close(empty)
	return pendingCount{empty: empty}
}

// add counts n more events.
func (p *pendingCount) add(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 && n > 0 {
		p.empty = make(chan struct{})
	}
	p.n += n
}

// done counts one event handled.
func (p *pendingCount) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n--
	if p.n == 0 {
		close(p.empty)
	}
}

// zero returns a channel closed once no event is pending.
func (p *pendingCount) zero() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.empty
}

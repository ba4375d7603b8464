package module

import "github.com/mulligan-gw/mulligan/store"

// What operators ask of the courier through the admin API (docs/operating.md, Admin API):
// dead letters back into the outbox, and an endpoint a 410 disabled back into service. The
// admin API routes the calls and writes the answers.

// redeliver puts dead letter id back in the outbox, due now, with a fresh attempt budget.
func (c *courier) redeliver(id string) (*store.Event, error) {
	ev, err := c.st.Redeliver(id, c.clock.Now())
	if err == nil {
		c.kick()
	}
	return ev, err
}

// redeliverAll redelivers what was dead when it was called, paging once through the dead
// letters in id order: one that dies again meanwhile sits behind the cursor, one dead-lettered
// after the call is left alone, so the walk ends however fast events die. It returns how many
// it redelivered.
func (c *courier) redeliverAll() (int, error) {
	called := c.clock.Now()
	n, after := 0, ""
	defer c.kick()
	for {
		events, err := c.st.DeadLetters(after, 500)
		if err != nil || len(events) == 0 {
			return n, err
		}
		for _, ev := range events {
			after = ev.ID
			if ev.DeadAt.After(called) {
				continue
			}
			if _, err := c.st.Redeliver(ev.ID, called); err != nil {
				return n, err
			}
			n++
		}
	}
}

// enable re-enables an endpoint a 410 disabled; its waiting events become due now. It returns
// how many.
func (c *courier) enable(name string) (int, error) {
	if err := c.st.SetEndpointState(name, store.EndpointState{}); err != nil {
		return 0, err
	}
	n, err := c.st.RescheduleEndpoint(name, c.clock.Now())
	if err == nil {
		c.kick()
	}
	return n, err
}

package courier

import "github.com/mulligan-gw/mulligan/store"

// What operators ask of the courier through the admin API (docs/operating.md, Admin API):
// dead letters back into the outbox, an endpoint a 410 disabled back into service, and what
// it is doing. The admin API routes the calls and writes the answers.

// Redeliver puts dead letter id back in the outbox, due now, with a fresh attempt budget.
func (c *Courier) Redeliver(id string) (*store.Event, error) {
	ev, err := c.st.Redeliver(id, c.clk.Now())
	if err == nil {
		c.Kick()
	}
	return ev, err
}

// RedeliverAll redelivers what was dead when it was called, paging once through the dead
// letters in id order: one that dies again meanwhile sits behind the cursor, one dead-lettered
// after the call is left alone, so the walk ends however fast events die. It returns how many
// it redelivered.
func (c *Courier) RedeliverAll() (int, error) {
	called := c.clk.Now()
	n, after := 0, ""
	defer c.Kick()
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

// Enable re-enables an endpoint a 410 disabled; its waiting events become due now. It returns
// how many.
func (c *Courier) Enable(name string) (int, error) {
	if err := c.st.SetEndpointState(name, store.EndpointState{}); err != nil {
		return 0, err
	}
	n, err := c.st.RescheduleEndpoint(name, c.clk.Now())
	if err == nil {
		c.Kick()
	}
	return n, err
}

// Stats is a snapshot of the courier, as the admin API shows it.
type Stats struct {
	Endpoints  map[string]EndpointStats `json:"endpoints"`
	Delivering int                      `json:"delivering"` // deliveries under way
	Passes     int64                    `json:"passes"`     // looks at the outbox so far
}

// EndpointStats is one configured endpoint's breaker state and whether a 410 disabled it.
type EndpointStats struct {
	Breaker  string `json:"breaker"`
	Disabled bool   `json:"disabled"`
}

// Stats reports what the courier is doing; an endpoint's disabled flag is read from the store.
func (c *Courier) Stats() Stats {
	c.mu.Lock()
	delivering := len(c.inflight)
	c.mu.Unlock()
	out := Stats{Endpoints: map[string]EndpointStats{}, Delivering: delivering, Passes: c.passes.Load()}
	for name, breaker := range c.Breakers() {
		st, _ := c.st.GetEndpointState(name)
		out.Endpoints[name] = EndpointStats{Breaker: breaker, Disabled: st.Disabled}
	}
	return out
}

// Breakers reports each configured endpoint's breaker state.
func (c *Courier) Breakers() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for name, ep := range c.endpoints {
		out[name] = c.deliverers[ep.Breaker].BreakerState(name)
	}
	return out
}

// RecentAttempts returns the latest attempts, oldest first.
func (c *Courier) RecentAttempts() []Attempt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Attempt{}, c.recent...) // [] in JSON when there is none, never null
}

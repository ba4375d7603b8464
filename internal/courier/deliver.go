package courier

import (
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/webhook"
)

// deliver makes one attempt at the claimed event and records what came of it.
func (c *Courier) deliver(claimed store.Due) {
	defer c.sends.Done()
	defer c.release(claimed)
	// The list the event came from may predate a delivery that just finished, here or on
	// another replica: claim it, which reads it again, so one worker at a time delivers it.
	ep, d, declared := c.endpoint(claimed.Endpoint)
	if !declared && !c.active() {
		return // a reload left no webhooks at all: the event waits, unclaimed and uncharged, for a config with some
	}
	ev, err := c.st.ClaimEvent(claimed.ID, c.opts.Worker, claimLease(ep))
	if err != nil || ev == nil {
		return
	}
	now := c.clk.Now()
	switch {
	case !declared && now.Sub(ev.AgeStart()) > unknownEndpointMaxAge:
		c.deadLetter(ev, "the endpoint was not configured for "+unknownEndpointMaxAge.String())
		return
	case !declared:
		// Another replica may declare it (a rolling deploy), or the next config may: leave the
		// event to them, uncharged; a config that declares the endpoint makes it due at once.
		c.reschedule(ev, now.Add(time.Minute), 0, nil)
		return
	case now.Sub(ev.AgeStart()) > ep.MaxAge: // a redelivery starts a fresh max_age
		c.deadLetter(ev, "undelivered past max_age")
		return
	}
	if state, err := c.st.GetEndpointState(ev.Endpoint); err == nil && state.Disabled {
		c.reschedule(ev, now.Add(time.Minute), 0, nil) // waits for the endpoint to be re-enabled
		return
	}
	body, err := c.opts.Render(ev, ev.Attempts+1)
	if err != nil {
		c.deadLetter(ev, "the event cannot be rendered: "+err.Error())
		return
	}
	header, end := http.Header{}, func(webhook.Outcome) {}
	if c.opts.Trace != nil {
		header, end = c.opts.Trace(c.ctx, ev)
	}
	out := d.Deliver(c.ctx, webhook.Endpoint{Name: ev.Endpoint, URL: ev.URL, Secrets: ep.Secrets, Style: ep.Style,
		Timeout: ep.Timeout, AllowPrivate: ep.AllowPrivate}, webhook.Message{ID: ev.ID, Body: body, Header: header, Type: ev.Type})
	end(out)
	if c.ctx.Err() != nil || out.Result == webhook.BreakerOpen {
		return // stopping, or the breaker opened meanwhile: the event waits, uncharged
	}
	c.remember(ev, out)
	if c.opts.Attempted != nil {
		c.opts.Attempted(ev.Endpoint, out.Result, max(out.Attempts, 1))
	}
	c.record(ev, out, ep)
}

// record writes the outcome of an attempt to the outbox.
func (c *Courier) record(ev *store.Event, out webhook.Outcome, ep Endpoint) {
	attempts := ev.Attempts + max(out.Attempts, 1)
	switch out.Result {
	case webhook.Delivered:
		c.logUnrecorded(ev, c.st.MarkDelivered(ev.ID, attemptOf(attempts, c.clk.Now(), &out)))
	case webhook.Disabled:
		c.log.Warn("endpoint answered 410 Gone: disabled until re-enabled", zap.String("endpoint", ev.Endpoint))
		// The event waits first, then the endpoint is marked: an operator who re-enables it as
		// soon as it shows disabled makes the event due, and no later write of ours delays it.
		c.reschedule(ev, c.clk.Now().Add(time.Minute), attempts, &out)
		_ = c.st.SetEndpointState(ev.Endpoint, store.EndpointState{Disabled: true, DisabledAt: c.clk.Now(), Reason: "410 Gone"})
	case webhook.DeadLetter:
		reason := "the receiver refused the event"
		if errors.Is(out.Err, webhook.ErrBlockedAddress) {
			reason = "the target address is blocked by the SSRF guard (allow_private permits it)"
		}
		c.deadLetterAfter(ev, attempts, &out, reason)
	default: // RetryLater
		if attempts >= ep.MaxAttempts {
			c.deadLetterAfter(ev, attempts, &out, "max_attempts reached")
			return
		}
		c.reschedule(ev, c.clk.Now().Add(ep.RetryWait(attempts-1, out.RetryAfter)), attempts, &out)
	}
}

func (c *Courier) reschedule(ev *store.Event, at time.Time, attempts int, out *webhook.Outcome) {
	c.logUnrecorded(ev, c.st.Reschedule(ev.ID, at, attemptOf(attempts, c.clk.Now(), out)))
}

func (c *Courier) deadLetter(ev *store.Event, reason string) {
	c.deadLetterAfter(ev, ev.Attempts, nil, reason)
}

func (c *Courier) deadLetterAfter(ev *store.Event, attempts int, out *webhook.Outcome, reason string) {
	if c.opts.DeadLettered != nil {
		c.opts.DeadLettered(ev.Endpoint)
	}
	fields := []zap.Field{zap.String("event_id", ev.ID), zap.String("operation_id", ev.OperationID),
		zap.String("endpoint", ev.Endpoint), zap.Int("attempts", attempts), zap.String("reason", reason)}
	if c.opts.EventFields != nil {
		fields = append(fields, c.opts.EventFields(ev)...)
	}
	c.log.Warn("event dead-lettered", fields...)
	c.logUnrecorded(ev, c.st.DeadLetter(ev.ID, reason, attemptOf(attempts, c.clk.Now(), out)))
}

// attemptOf is an attempt's outcome as the outbox keeps it; a zero attempts keeps the count.
func attemptOf(attempts int, at time.Time, out *webhook.Outcome) store.Attempt {
	a := store.Attempt{Attempts: attempts, At: at}
	if out != nil {
		a.Status = out.StatusCode
		if out.Err != nil {
			a.Error = out.Err.Error()
		}
	}
	return a
}

// claimLease is how long a delivery holds its event: the attempt's timeout and a margin,
// after which another worker may deliver it (this one died).
func claimLease(ep Endpoint) time.Duration {
	timeout := webhook.DefaultTimeout
	if ep.Timeout > 0 {
		timeout = ep.Timeout
	}
	return 2*timeout + 10*time.Second
}

// logUnrecorded logs a delivery outcome the outbox could not record (the event is tried again
// after the claim lapses).
func (c *Courier) logUnrecorded(ev *store.Event, err error) {
	if err != nil && !errors.Is(err, store.ErrClosed) {
		c.log.Error("recording a delivery", zap.String("event_id", ev.ID), zap.Error(err))
	}
}

// remember keeps the attempt for the admin API's recent attempts.
func (c *Courier) remember(ev *store.Event, out webhook.Outcome) {
	a := Attempt{At: c.clk.Now(), EventID: ev.ID, Endpoint: ev.Endpoint, Result: out.Result.String(), Status: out.StatusCode, LatencyMS: out.Latency.Milliseconds()}
	if out.Err != nil {
		a.Error = out.Err.Error()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.recent) >= recentAttemptsKept {
		c.recent = c.recent[1:]
	}
	c.recent = append(c.recent, a)
}

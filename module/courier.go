package module

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/webhook"
)

// Delivery concurrency: in all, and per endpoint, so one slow endpoint cannot take every slot.
const (
	maxDeliveries            = 128
	maxDeliveriesPerEndpoint = 32
	recentAttemptsKept       = 200
)

// courier delivers the outbox: it reads due events from the store, signs and sends each through
// the webhook package, and writes back the outcome: delivered, retry later (durably scheduled
// with backoff), dead letter, or endpoint disabled (410). It lives as long as its runner; it
// claims each event before sending it, so one replica at a time delivers it.
type courier struct {
	st     store.Outbox
	worker string
	log    *zap.Logger
	clock  clockwork.Clock // the runner's

	mu          sync.Mutex
	endpoints   map[string]*webhookSetup // each endpoint's declaring block, across the storage's blocks
	deliverers  map[[2]int64]*webhook.Deliverer
	inflight    map[string]bool
	perEndpoint map[string]int
	recent      []attemptLog
	scanFrom    time.Time // no pending event is due before this (see advanceScan)
	fullScanAt  time.Time

	passes atomic.Int64 // looks at the outbox so far: operators and tests see the courier at work

	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	sends  sync.WaitGroup
}

// attemptLog is one delivery attempt, kept in memory for the admin API.
type attemptLog struct {
	At        time.Time `json:"at"`
	EventID   string    `json:"event_id"`
	Endpoint  string    `json:"endpoint"`
	Result    string    `json:"result"`
	Status    int       `json:"status,omitempty"`
	LatencyMS int64     `json:"latency_ms"`
	Error     string    `json:"error,omitempty"`
}

func newCourier(st store.Outbox, worker string, clock clockwork.Clock, log *zap.Logger) *courier {
	ctx, cancel := context.WithCancel(context.Background())
	c := &courier{
		st: st, worker: worker, log: log.Named("webhooks"), clock: clock, deliverers: map[[2]int64]*webhook.Deliverer{},
		inflight: map[string]bool{}, perEndpoint: map[string]int{},
		wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{}),
	}
	go c.loop()
	return c
}

// configure installs the endpoints of every block on the storage; the circuit breakers are
// kept unless their settings change.
func (c *courier) configure(endpoints map[string]*webhookSetup) {
	zeroWebhookCounters(endpoints)
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range endpoints {
		if c.endpoints[name] == nil {
			c.wakeEndpoint(name)
		}
	}
	c.endpoints = endpoints
	kept := map[[2]int64]*webhook.Deliverer{}
	for _, h := range endpoints {
		key := breakerKey(h)
		if d := c.deliverers[key]; d != nil {
			kept[key] = d
		} else if kept[key] == nil {
			kept[key] = webhook.NewDeliverer(webhook.Options{
				BreakerFailures: uint32(h.cfg.BreakerFailures), BreakerCooldown: time.Duration(h.cfg.BreakerCooldown),
				UserAgent: "Mulligan-Webhooks/1",
			})
		}
	}
	c.deliverers = kept
	c.kickLocked()
}

// unknownEndpointMaxAge is how long an event waits for a config that declares its endpoint
// before it is dead-lettered: the default max_age.
const unknownEndpointMaxAge = 72 * time.Hour

// wakeEndpoint makes the events waiting for an endpoint this config now declares due at once.
func (c *courier) wakeEndpoint(name string) {
	go func() {
		if _, err := c.st.RescheduleEndpoint(name, c.clock.Now()); err != nil && !errors.Is(err, store.ErrClosed) {
			c.log.Warn("making a newly configured endpoint's events due", zap.String("endpoint", name), zap.Error(err))
		}
		c.kick()
	}()
}

func breakerKey(h *webhookSetup) [2]int64 {
	return [2]int64{int64(h.cfg.BreakerFailures), int64(h.cfg.BreakerCooldown)}
}

// endpoint returns the block declaring endpoint name and the deliverer of its breaker
// settings; nil when no block on the storage declares it.
func (c *courier) endpoint(name string) (*webhookSetup, *webhook.Deliverer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.endpoints[name]
	if h == nil {
		return nil, nil
	}
	return h, c.deliverers[breakerKey(h)]
}

func (c *courier) kick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kickLocked()
}

func (c *courier) kickLocked() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// flush keeps delivering until no event is due or the deadline passes.
func (c *courier) flush(deadline time.Time) {
	for c.clock.Now().Before(deadline) {
		due, err := c.st.DueEvents(time.Time{}, c.clock.Now(), 1)
		if err != nil || len(due) == 0 {
			return
		}
		c.kick()
		c.clock.Sleep(20 * time.Millisecond)
	}
}

// stop ends delivery; attempts under way are abandoned uncounted and run again later.
func (c *courier) stop() {
	c.cancel()
	<-c.done
	c.sends.Wait()
}

func (c *courier) loop() {
	defer close(c.done)
	for {
		wait := c.dispatchDue()
		t := c.clock.NewTimer(wait)
		select {
		case <-c.ctx.Done():
			t.Stop()
			return
		case <-c.wake:
		case <-t.Chan():
		}
		t.Stop()
	}
}

// dispatchDue starts deliveries of due events while slots are free, and says how long to wait
// before looking again.
func (c *courier) dispatchDue() time.Duration {
	defer c.passes.Add(1)
	if !c.active() {
		return time.Second
	}
	from := c.advanceScan()
	due, err := c.st.DueEvents(from, c.clock.Now(), 4*maxDeliveries)
	if err != nil {
		c.log.Error("reading the outbox", zap.Error(err))
		return time.Second
	}
	wait := time.Duration(0)
	for _, d := range due {
		switch c.claim(d) {
		case claimed:
			c.sends.Add(1)
			go c.deliver(d)
		case busy:
			wait = max(wait, time.Second) // a finishing delivery kicks the loop
		case breakerOpen:
			wait = breakerPoll
		}
	}
	if wait > 0 {
		return wait
	}
	return c.untilNextDue()
}

// active reports whether any block on the storage configures webhooks: without, events wait.
func (c *courier) active() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.endpoints) > 0
}

// breakerPoll paces the look at events waiting for an open breaker's probe.
const breakerPoll = 100 * time.Millisecond

type claimResult int

const (
	claimed claimResult = iota
	busy
	breakerOpen
)

// claim reserves a delivery slot for ev. An event whose endpoint's breaker is open (or probing)
// waits, uncharged.
func (c *courier) claim(ev store.Due) claimResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight[ev.ID] || c.perEndpoint[ev.Endpoint] >= maxDeliveriesPerEndpoint || len(c.inflight) >= maxDeliveries {
		return busy
	}
	if h := c.endpoints[ev.Endpoint]; h != nil {
		d := c.deliverers[breakerKey(h)]
		if d.BreakerState(ev.Endpoint) != "closed" && c.perEndpoint[ev.Endpoint] > 0 {
			return breakerOpen // half-open with its probe under way, or open
		}
		if d.BreakerState(ev.Endpoint) == "open" {
			return breakerOpen
		}
	}
	c.inflight[ev.ID] = true
	c.perEndpoint[ev.Endpoint]++
	return claimed
}

func (c *courier) release(ev store.Due) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.inflight, ev.ID)
	c.perEndpoint[ev.Endpoint]--
	c.kickLocked()
}

// scanMargin covers an event announced in a transaction that commits after the courier looked:
// its due time is when it was announced, a moment before.
const scanMargin = 5 * time.Second

// advanceScan returns where the outbox scan starts: a little before the soonest pending event,
// so that the tombstones of delivered events are not walked again and again. Once a minute it
// starts from the beginning, in case anything was missed.
func (c *courier) advanceScan() time.Time {
	now := c.clock.Now()
	if now.After(c.fullScanAt) {
		c.scanFrom, c.fullScanAt = time.Time{}, now.Add(time.Minute)
	}
	next, err := c.st.NextDue(c.scanFrom)
	switch {
	case err != nil:
		return time.Time{}
	case next.IsZero() || next.After(now):
		next = now
	}
	if from := next.Add(-scanMargin); from.After(c.scanFrom) {
		c.scanFrom = from
	}
	return c.scanFrom
}

func (c *courier) untilNextDue() time.Duration {
	next, err := c.st.NextDue(c.scanFrom)
	if err != nil || next.IsZero() {
		return time.Second
	}
	return min(max(c.clock.Until(next), time.Millisecond), time.Second)
}

// deliver makes one attempt at ev and records what came of it.
func (c *courier) deliver(claimed store.Due) {
	defer c.sends.Done()
	defer c.release(claimed)
	// The list ev came from may predate a delivery that just finished, here or on another
	// replica: claim it, which reads it again, so one worker at a time delivers it.
	h, d := c.endpoint(claimed.Endpoint)
	if h == nil && !c.active() {
		return // a reload left no webhooks at all: the event waits, unclaimed and uncharged, for a config with some
	}
	ev, err := c.st.ClaimEvent(claimed.ID, c.worker, claimLease(h))
	if err != nil || ev == nil {
		return
	}
	var ep *endpoint
	if h != nil {
		ep = h.endpoints[ev.Endpoint]
	}
	now := c.clock.Now()
	switch {
	case ep == nil && now.Sub(ev.AgeStart()) > unknownEndpointMaxAge:
		c.deadLetter(ev, "the endpoint was not configured for "+unknownEndpointMaxAge.String())
		return
	case ep == nil:
		// Another replica may declare it (a rolling deploy), or the next config may: leave the
		// event to them, uncharged; a config that declares the endpoint makes it due at once.
		c.reschedule(ev, now.Add(time.Minute), 0, nil)
		return
	case now.Sub(ev.AgeStart()) > time.Duration(h.cfg.MaxAge): // a redelivery starts a fresh max_age
		c.deadLetter(ev, "undelivered past max_age")
		return
	}
	if state, err := c.st.GetEndpointState(ev.Endpoint); err == nil && state.Disabled {
		c.reschedule(ev, now.Add(time.Minute), 0, nil) // waits for the endpoint to be re-enabled
		return
	}
	var body []byte
	body, err = renderEvent(ev, ev.Attempts+1)
	if err != nil {
		c.deadLetter(ev, "the event cannot be rendered: "+err.Error())
		return
	}
	span, header := startDelivery(c.ctx, ev)
	out := d.Deliver(c.ctx, webhook.Endpoint{Name: ep.name, URL: ev.URL, Secrets: ep.secrets, Style: ep.style,
		Timeout: time.Duration(h.cfg.Timeout), AllowPrivate: h.cfg.AllowPrivate}, webhook.Message{ID: ev.ID, Body: body, Header: header, Type: ev.Type})
	endDelivery(span, out)
	if c.ctx.Err() != nil || out.Result == webhook.BreakerOpen {
		return // stopping, or the breaker opened meanwhile: the event waits, uncharged
	}
	c.remember(ev, out)
	metrics.attempts.WithLabelValues(ev.Endpoint, out.Result.String()).Add(float64(max(out.Attempts, 1)))
	c.record(ev, out, h)
}

// record writes the outcome of an attempt to the outbox.
func (c *courier) record(ev *store.Event, out webhook.Outcome, h *webhookSetup) {
	attempts := ev.Attempts + max(out.Attempts, 1)
	switch out.Result {
	case webhook.Delivered:
		c.logUnrecorded(ev, c.st.MarkDelivered(ev.ID, attemptOf(attempts, c.clock.Now(), &out)))
	case webhook.Disabled:
		c.log.Warn("endpoint answered 410 Gone: disabled until re-enabled", zap.String("endpoint", ev.Endpoint))
		// The event waits first, then the endpoint is marked: an operator who re-enables it as
		// soon as it shows disabled makes the event due, and no later write of ours delays it.
		c.reschedule(ev, c.clock.Now().Add(time.Minute), attempts, &out)
		_ = c.st.SetEndpointState(ev.Endpoint, store.EndpointState{Disabled: true, DisabledAt: c.clock.Now(), Reason: "410 Gone"})
	case webhook.DeadLetter:
		reason := "the receiver refused the event"
		if errors.Is(out.Err, webhook.ErrBlockedAddress) {
			reason = "the target address is blocked by the SSRF guard (allow_private permits it)"
		}
		c.deadLetterAfter(ev, attempts, &out, reason)
	default: // RetryLater
		if attempts >= h.cfg.MaxAttempts {
			c.deadLetterAfter(ev, attempts, &out, "max_attempts reached")
			return
		}
		c.reschedule(ev, c.clock.Now().Add(h.retryWait(attempts-1, out.RetryAfter)), attempts, &out)
	}
}

func (c *courier) reschedule(ev *store.Event, at time.Time, attempts int, out *webhook.Outcome) {
	c.logUnrecorded(ev, c.st.Reschedule(ev.ID, at, attemptOf(attempts, c.clock.Now(), out)))
}

func (c *courier) deadLetter(ev *store.Event, reason string) {
	c.deadLetterAfter(ev, ev.Attempts, nil, reason)
}

func (c *courier) deadLetterAfter(ev *store.Event, attempts int, out *webhook.Outcome, reason string) {
	metrics.deadLetters.WithLabelValues(ev.Endpoint).Inc()
	c.log.Warn("event dead-lettered", append([]zap.Field{zap.String("event_id", ev.ID), zap.String("operation_id", ev.OperationID),
		zap.String("endpoint", ev.Endpoint), zap.Int("attempts", attempts), zap.String("reason", reason)},
		traceContext{parent: ev.Traceparent, state: ev.Tracestate}.fields()...)...)
	c.logUnrecorded(ev, c.st.DeadLetter(ev.ID, reason, attemptOf(attempts, c.clock.Now(), out)))
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
func claimLease(h *webhookSetup) time.Duration {
	timeout := webhook.DefaultTimeout
	if h != nil {
		timeout = time.Duration(h.cfg.Timeout)
	}
	return 2*timeout + 10*time.Second
}

// logUnrecorded logs a delivery outcome the outbox could not record (the event is tried again
// after the claim lapses).
func (c *courier) logUnrecorded(ev *store.Event, err error) {
	if err != nil && !errors.Is(err, store.ErrClosed) {
		c.log.Error("recording a delivery", zap.String("event_id", ev.ID), zap.Error(err))
	}
}

// remember keeps the attempt for the admin API's recent attempts.
func (c *courier) remember(ev *store.Event, out webhook.Outcome) {
	a := attemptLog{At: c.clock.Now(), EventID: ev.ID, Endpoint: ev.Endpoint, Result: out.Result.String(), Status: out.StatusCode, LatencyMS: out.Latency.Milliseconds()}
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

// breakerStates reports each configured endpoint's breaker state.
func (c *courier) breakerStates() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for name, h := range c.endpoints {
		out[name] = c.deliverers[breakerKey(h)].BreakerState(name)
	}
	return out
}

// delivering counts the deliveries under way.
func (c *courier) delivering() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.inflight)
}

// endpointStates reports each configured endpoint's breaker and whether a 410 disabled it.
func (c *courier) endpointStates() map[string]any {
	out := map[string]any{}
	for name, breaker := range c.breakerStates() {
		st, _ := c.st.GetEndpointState(name)
		out[name] = map[string]any{"breaker": breaker, "disabled": st.Disabled}
	}
	return out
}

// recentAttempts returns the latest attempts, oldest first.
func (c *courier) recentAttempts() []attemptLog {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]attemptLog{}, c.recent...) // [] in JSON when there is none, never null
}

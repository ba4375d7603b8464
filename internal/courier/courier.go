package courier

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/webhook"
)

// Delivery concurrency: in all, and per endpoint, so one slow endpoint cannot take every slot.
const (
	maxDeliveries            = 128
	maxDeliveriesPerEndpoint = 32
	recentAttemptsKept       = 200
)

// Options is what a courier is built from. Store is required; the rest have defaults.
type Options struct {
	Store store.Outbox
	// Worker names this courier in event claims; one per storage handle.
	Worker string
	// Clock paces the loop and stamps attempts and due times; nil is the real clock.
	Clock clockwork.Clock
	Log   *zap.Logger
	// Render is the body of an event's delivery attempt (1 for the first); required.
	Render func(ev *store.Event, attempt int) ([]byte, error)
	// Trace starts the span of a delivery: the headers it carries and the function that ends
	// the span with the outcome. Nil traces nothing.
	Trace func(ctx context.Context, ev *store.Event) (http.Header, func(webhook.Outcome))
	// EventFields are the log fields of an event besides its ids (its trace); nil adds none.
	EventFields func(ev *store.Event) []zap.Field
	// Attempted counts attempts at endpoint with result; DeadLettered counts dead letters.
	Attempted    func(endpoint string, result webhook.Result, attempts int)
	DeadLettered func(endpoint string)
}

// Endpoint is how events for one named endpoint are delivered: the signature and the settings
// of the block declaring it.
type Endpoint struct {
	Style        webhook.Style
	Secrets      []webhook.Secret
	Timeout      time.Duration // one attempt's; zero is webhook.DefaultTimeout
	AllowPrivate bool
	MaxAge       time.Duration // past it an undelivered event is dead-lettered
	MaxAttempts  int
	Breaker      Breaker
	// RetryWait is the wait before retry number retry (0 for the first), given the receiver's
	// Retry-After (zero when it sent none).
	RetryWait func(retry int, retryAfter time.Duration) time.Duration
}

// Breaker is an endpoint's circuit-breaker settings; endpoints with the same share a deliverer.
type Breaker struct {
	Failures uint32
	Cooldown time.Duration
}

// Courier delivers one storage's outbox. Build it with New, then Start; Stop waits for it.
type Courier struct {
	opts Options
	st   store.Outbox
	log  *zap.Logger
	clk  clockwork.Clock

	// configuring is held by Configure while it makes a new endpoint's waiting events due and
	// installs it; a delivery reads its endpoint only after (see Configure).
	configuring sync.Mutex
	mu          sync.Mutex
	endpoints   map[string]Endpoint // by name, across the storage's blocks
	deliverers  map[Breaker]*webhook.Deliverer
	inflight    map[string]bool
	perEndpoint map[string]int
	recent      []Attempt
	scanFrom    time.Time // no pending event is due before this (see advanceScan)
	fullScanAt  time.Time

	passes atomic.Int64 // looks at the outbox so far: operators and tests see the courier at work

	wake    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	started sync.Once
	running atomic.Bool
	done    chan struct{}
	sends   sync.WaitGroup
}

// Attempt is one delivery attempt, kept in memory for the admin API.
type Attempt struct {
	At        time.Time `json:"at"`
	EventID   string    `json:"event_id"`
	Endpoint  string    `json:"endpoint"`
	Result    string    `json:"result"`
	Status    int       `json:"status,omitempty"`
	LatencyMS int64     `json:"latency_ms"`
	Error     string    `json:"error,omitempty"`
}

// New returns a courier on opts.Store, not started.
func New(opts Options) *Courier {
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Courier{
		opts: opts, st: opts.Store, log: opts.Log.Named("webhooks"), clk: opts.Clock,
		deliverers: map[Breaker]*webhook.Deliverer{}, inflight: map[string]bool{}, perEndpoint: map[string]int{},
		wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{}),
	}
}

// Start begins delivering; once only.
func (c *Courier) Start() {
	c.started.Do(func() {
		c.running.Store(true)
		go c.loop()
	})
}

// Stop ends delivery and returns once the loop and every attempt under way have ended;
// attempts under way are abandoned uncounted and run again later. Safe to call more than
// once, and without Start.
func (c *Courier) Stop() {
	c.started.Do(func() { close(c.done) }) // never started: nothing to wait for
	c.cancel()
	<-c.done
	c.sends.Wait()
}

// Configure installs the endpoints of every block on the storage; the circuit breakers are
// kept unless their settings change. An endpoint new to the courier has its waiting events
// made due before it is installed, and no delivery reads the endpoints meanwhile: made due any
// later, the events could include one whose attempt had just recorded its retry wait, which
// would then be cut short.
func (c *Courier) Configure(endpoints map[string]Endpoint) {
	c.configuring.Lock()
	defer c.configuring.Unlock()
	c.mu.Lock()
	var added []string
	for name := range endpoints {
		if _, ok := c.endpoints[name]; !ok {
			added = append(added, name)
		}
	}
	c.mu.Unlock()
	for _, name := range added {
		c.wakeEndpoint(name)
	}
	c.mu.Lock()
	c.endpoints = endpoints
	kept := map[Breaker]*webhook.Deliverer{}
	for _, ep := range endpoints {
		if d := c.deliverers[ep.Breaker]; d != nil {
			kept[ep.Breaker] = d
		} else if kept[ep.Breaker] == nil {
			kept[ep.Breaker] = webhook.NewDeliverer(webhook.Options{
				BreakerFailures: ep.Breaker.Failures, BreakerCooldown: ep.Breaker.Cooldown, UserAgent: "Mulligan-Webhooks/1",
			})
		}
	}
	c.deliverers = kept
	c.mu.Unlock()
	c.Kick()
}

// unknownEndpointMaxAge is how long an event waits for a config that declares its endpoint
// before it is dead-lettered: the default max_age.
const unknownEndpointMaxAge = 72 * time.Hour

// wakeEndpoint makes the events waiting for an endpoint this config now declares due at once.
func (c *Courier) wakeEndpoint(name string) {
	if _, err := c.st.RescheduleEndpoint(name, c.clk.Now()); err != nil && !errors.Is(err, store.ErrClosed) {
		c.log.Warn("making a newly configured endpoint's events due", zap.String("endpoint", name), zap.Error(err))
	}
}

// endpoint returns endpoint name's settings and the deliverer of its breaker settings; false
// when no block on the storage declares it. It waits for a Configure under way.
func (c *Courier) endpoint(name string) (Endpoint, *webhook.Deliverer, bool) {
	c.configuring.Lock()
	defer c.configuring.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	ep, ok := c.endpoints[name]
	if !ok {
		return Endpoint{}, nil, false
	}
	return ep, c.deliverers[ep.Breaker], true
}

// Kick asks for a look at the outbox soon: an event was announced or made due.
func (c *Courier) Kick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kickLocked()
}

func (c *Courier) kickLocked() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Flush keeps delivering until no event is due or the deadline passes.
func (c *Courier) Flush(deadline time.Time) {
	if !c.running.Load() {
		return
	}
	for c.clk.Now().Before(deadline) {
		due, err := c.st.DueEvents(time.Time{}, c.clk.Now(), 1)
		if err != nil || len(due) == 0 {
			return
		}
		c.Kick()
		c.clk.Sleep(20 * time.Millisecond)
	}
}

func (c *Courier) loop() {
	defer close(c.done)
	for {
		wait := c.dispatchDue()
		t := c.clk.NewTimer(wait)
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
func (c *Courier) dispatchDue() time.Duration {
	defer c.passes.Add(1)
	if !c.active() {
		return time.Second
	}
	from := c.advanceScan()
	due, err := c.st.DueEvents(from, c.clk.Now(), 4*maxDeliveries)
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
func (c *Courier) active() bool {
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
func (c *Courier) claim(ev store.Due) claimResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight[ev.ID] || c.perEndpoint[ev.Endpoint] >= maxDeliveriesPerEndpoint || len(c.inflight) >= maxDeliveries {
		return busy
	}
	if ep, ok := c.endpoints[ev.Endpoint]; ok {
		d := c.deliverers[ep.Breaker]
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

func (c *Courier) release(ev store.Due) {
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
func (c *Courier) advanceScan() time.Time {
	now := c.clk.Now()
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

func (c *Courier) untilNextDue() time.Duration {
	next, err := c.st.NextDue(c.scanFrom)
	if err != nil || next.IsZero() {
		return time.Second
	}
	return min(max(c.clk.Until(next), time.Millisecond), time.Second)
}

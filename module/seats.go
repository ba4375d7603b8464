package module

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/store"
)

// seatPools holds the seats of every capacity block in this process, keyed by the upstream the
// block guards (seatPoolKey). They are process-wide, not per config: a call that started under
// the old config keeps its seat through a reload, and the new config's calls count against
// the same seats (docs/capacity.md).
var seatPools = caddy.NewUsagePool()

// errNoSeat: no seat came free within the call's wait.
var errNoSeat = errors.New("no upstream seat came free in time")

// seatPoolKey identifies a block's upstream across reloads: the storage and the operations
// prefix it serves, which is what makes two blocks one gateway in front of one model server.
func seatPoolKey(where, prefix string) string { return where + "|" + prefix }

// seatAsk is who asks for a seat: the order they wait in.
type seatAsk struct {
	urgency int
	scope   string
	since   time.Time // when the work began to wait (an operation: when it was submitted)
	queued  bool      // an operation claimed from the durable queue, not a live sync call
}

// seatWaiter is one ask waiting in the pool.
type seatWaiter struct {
	ask     seatAsk
	ready   chan struct{} // closed when granted
	granted bool
	taken   bool // the seat went to the caller (or was given back unused)
}

// seatPool is one upstream's seats in this process, and the one order its waiters are served
// in: effective urgency (urgency raised one level per store.AgingStep waited), then the scope that
// was served least recently, then the oldest.
type seatPool struct {
	key   string
	where string // the storage whose runners claim operations for these seats
	label string // how metrics and stats name it: the storage as operators see it, and the prefix
	now   func() time.Time

	mu      sync.Mutex
	cfg     CapacityConfig
	limit   int
	inUse   int
	waiting []*seatWaiter
	turns   map[string]uint64 // scope with waiters -> number of the grant it got last
	grants  uint64
	queued  int // waiters that are operations from the durable queue
	adapt   *adaptiveLimit
	drain   drainRate
	stats   seatCounters

	sharedName string       // the pool's name among replicas (capacity shared)
	shared     *sharedSeats // nil until first needed, or without shared
}

// seatCounters are a pool's totals since the process started.
type seatCounters struct {
	refused       int64 // sync calls that found no seat within their wait
	queueTimeouts int64 // operations failed QUEUE_TIMEOUT
}

func newSeatPool(key, where, label, sharedName string, cfg CapacityConfig) *seatPool {
	p := &seatPool{key: key, where: where, label: label, sharedName: sharedName, now: time.Now,
		turns: map[string]uint64{}}
	p.configure(cfg)
	return p
}

// Destruct lets the pool go with the last config. Calls still holding shared seats keep
// them renewed until they end: the renewer runs while any seat is held.
func (p *seatPool) Destruct() error { return nil }

// configure applies a (re)loaded block's settings; seats in use stay in use.
func (p *seatPool) configure(cfg CapacityConfig) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg = cfg
	switch {
	case !cfg.Auto:
		p.adapt, p.limit = nil, cfg.Limit
	case p.adapt == nil:
		p.adapt = newAdaptiveLimit(cfg.Min, cfg.Max)
		p.limit = p.adapt.current()
	default:
		p.adapt.bound(cfg.Min, cfg.Max)
		p.limit = p.adapt.current()
	}
	p.grantLocked()
}

// seat is one held seat; release gives it back once.
type seat struct {
	pool   *seatPool
	start  time.Time
	once   sync.Once
	shared *heldSeat    // the shared seat also held (capacity shared); nil without
	from   *sharedSeats // where shared came from: a reload may drop `shared` while it is held
}

// acquire waits for a seat in the pool's order, up to wait (zero: until ctx ends).
func (p *seatPool) acquire(ctx context.Context, ask seatAsk, wait time.Duration) (*seat, error) {
	return p.awaitAll(ctx, p.enqueue(ask), wait)
}

// awaitAll is await, then a shared seat too when the pool has `shared`, within the same wait.
func (p *seatPool) awaitAll(ctx context.Context, w *seatWaiter, wait time.Duration) (*seat, error) {
	var deadline time.Time
	if wait > 0 {
		deadline = time.Now().Add(wait)
	}
	s, err := p.await(ctx, w, wait)
	if err != nil {
		return nil, err
	}
	if err := p.acquireShared(ctx, s, deadline); err != nil {
		return nil, err
	}
	return s, nil
}

// enqueue puts ask in the order, granting it a seat at once when one is free and nobody waits.
func (p *seatPool) enqueue(ask seatAsk) *seatWaiter {
	w := &seatWaiter{ask: ask, ready: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waiting) == 0 && p.inUse < p.limit {
		p.grantToLocked(w)
		return w
	}
	p.waiting = append(p.waiting, w)
	if ask.queued {
		p.queued++
	}
	return w
}

// await waits for w's seat up to wait (zero: until ctx ends); on failure w leaves the order.
func (p *seatPool) await(ctx context.Context, w *seatWaiter, wait time.Duration) (*seat, error) {
	began := time.Now()
	defer func() { capacityMetrics.seatWait.Observe(time.Since(began).Seconds()) }()
	var expired <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		expired = t.C
	}
	var err error
	select {
	case <-w.ready:
	case <-expired:
		err = errNoSeat
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !w.granted {
		p.dropLocked(w)
		return nil, err
	}
	w.taken = true // granted, perhaps in the same instant the wait ended: the seat is the caller's
	return &seat{pool: p, start: p.now()}, nil
}

// acquireShared adds a shared seat to s when the pool has `shared`, waiting no later than
// deadline (zero: until ctx ends); without one, s is given back unused.
func (p *seatPool) acquireShared(ctx context.Context, s *seat, deadline time.Time) error {
	shared := p.sharedFor()
	if shared == nil {
		return nil
	}
	h, err := shared.take(ctx, deadline)
	if err != nil {
		s.giveBack()
		return err
	}
	s.shared, s.from = h, shared
	return nil
}

// watch returns ctx for the call holding s: canceled with errSeatLapsed when its shared seat
// can no longer be renewed before its lease ends, since another replica may then take it
// (docs/capacity.md). stop ends the watch; without a shared seat ctx is returned as it is.
func (s *seat) watch(ctx context.Context) (_ context.Context, stop func()) {
	if s.shared == nil {
		return ctx, func() {}
	}
	return s.from.watch(ctx, s.shared)
}

// abandon takes w out of the order for good: a seat granted to it and never taken is freed.
func (p *seatPool) abandon(w *seatWaiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !w.granted:
		p.dropLocked(w)
	case !w.taken:
		w.taken = true
		p.inUse--
		p.grantLocked()
	}
}

func (p *seatPool) dropLocked(w *seatWaiter) {
	for i, x := range p.waiting {
		if x == w {
			p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
			if w.ask.queued {
				p.queued--
			}
			p.forgetIdleLocked(w.ask.scope)
			return
		}
	}
}

// forgetIdleLocked drops the turn of a scope nobody of which waits any more, so the map holds
// only the scopes waiting (scopes are as many as callers). A scope that comes back counts as
// not served lately: it goes before the scopes with a backlog, as a light tenant should.
func (p *seatPool) forgetIdleLocked(scope string) {
	for _, x := range p.waiting {
		if x.ask.scope == scope {
			return
		}
	}
	delete(p.turns, scope)
}

// release gives the seat back, telling the adaptive limit how the call went: overloaded is a
// 429 or 503 answer or a timeout (docs/capacity.md).
func (s *seat) release(overloaded bool) {
	s.once.Do(func() {
		p := s.pool
		if s.shared != nil {
			// After the local seat is back: a failed give must not leak it.
			defer s.from.give(s.shared)
		}
		now := p.now()
		p.mu.Lock()
		p.inUse--
		p.drain.record(now)
		if p.adapt != nil {
			p.limit = p.adapt.update(now.Sub(s.start), overloaded, p.inUse+1)
		}
		p.grantLocked()
		p.mu.Unlock()
		kickRunners(p.where) // a seat may be free for queued work
	})
}

// giveBack returns a seat that was never used for a call: it tells the limit nothing.
func (s *seat) giveBack() {
	s.once.Do(func() {
		p := s.pool
		p.mu.Lock()
		p.inUse--
		p.grantLocked()
		p.mu.Unlock()
		kickRunners(p.where)
	})
}

// grantLocked gives free seats to the next waiters in order.
func (p *seatPool) grantLocked() {
	for p.inUse < p.limit && len(p.waiting) > 0 {
		w := p.waiting[p.nextLocked(p.now())]
		p.dropLocked(w)
		p.grantToLocked(w)
	}
}

// grantToLocked gives w a seat.
func (p *seatPool) grantToLocked(w *seatWaiter) {
	p.inUse++
	p.grants++
	p.turns[w.ask.scope] = p.grants
	p.forgetIdleLocked(w.ask.scope)
	w.granted = true
	close(w.ready)
}

// nextLocked picks the waiter served next: the lowest effective urgency, then the scope whose
// last seat is the longest ago (scopes take turns), then the oldest.
func (p *seatPool) nextLocked(now time.Time) int {
	best := 0
	for i := 1; i < len(p.waiting); i++ {
		if p.before(p.waiting[i], p.waiting[best], now) {
			best = i
		}
	}
	return best
}

func (p *seatPool) before(a, b *seatWaiter, now time.Time) bool {
	if ua, ub := effectiveUrgency(a.ask, now), effectiveUrgency(b.ask, now); ua != ub {
		return ua < ub
	}
	if ta, tb := p.turns[a.ask.scope], p.turns[b.ask.scope]; ta != tb {
		return ta < tb
	}
	return a.ask.since.Before(b.ask.since)
}

// effectiveUrgency is the ask's urgency raised by waiting, as the durable queue raises it
// (store.AgingStep per level), so a steady stream of more urgent work cannot starve it.
func effectiveUrgency(a seatAsk, now time.Time) int {
	return store.EffectiveUrgency(a.urgency, now.Sub(a.since))
}

// roomForQueued reports whether the runner should claim one more operation for this pool: a
// seat is free for it, or no operation from the durable queue waits here yet. Keeping one
// claimed operation waiting stands the durable queue's head in this order, so a freed seat goes
// to it when it is more urgent than the live sync calls waiting (docs/capacity.md).
func (p *seatPool) roomForQueued() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inUse+len(p.waiting) < p.limit || p.queued == 0
}

// retryAfter estimates when a refused call may find a seat: the work waiting ahead of it over
// the measured drain rate, between 1s and 5 minutes.
func (p *seatPool) retryAfter() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drain.timeFor(len(p.waiting)+1, p.now())
}

// seatSnapshot is a pool's state for metrics and /mulligan/stats.
type seatSnapshot struct {
	Limit          int     `json:"limit"`
	Auto           bool    `json:"auto"`
	InUse          int     `json:"in_use"`
	Waiting        [8]int  `json:"waiting_by_urgency"`
	DrainPerSecond float64 `json:"drain_per_second"`
	Refused        int64   `json:"refused"`
	QueueTimeouts  int64   `json:"queue_timeouts"`
}

func (p *seatPool) snapshot() seatSnapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := seatSnapshot{Limit: p.limit, Auto: p.adapt != nil, InUse: p.inUse, DrainPerSecond: p.drain.perSecond(p.now()),
		Refused: p.stats.refused, QueueTimeouts: p.stats.queueTimeouts}
	for _, w := range p.waiting {
		s.Waiting[w.ask.urgency]++
	}
	return s
}

// countRefusal counts a sync call answered 503 UPSTREAM_SATURATED (a call queued instead is
// not refused).
func (p *seatPool) countRefusal() {
	capacityMetrics.refusals.Inc()
	p.mu.Lock()
	p.stats.refused++
	p.mu.Unlock()
}

func (p *seatPool) countQueueTimeout() {
	p.mu.Lock()
	p.stats.queueTimeouts++
	p.mu.Unlock()
}

// drainRate measures how fast seats come free: the last drainSamples releases.
type drainRate struct {
	times [drainSamples]time.Time
	n     int
}

const drainSamples = 64

func (d *drainRate) record(at time.Time) {
	d.times[d.n%drainSamples] = at
	d.n++
}

// drainWindow is how far back a release still tells the drain rate: older samples describe a
// load that is gone.
const drainWindow = time.Minute

// perSecond is the releases per second over the samples of the last drainWindow (0 with fewer
// than two: the rate is not known).
func (d *drainRate) perSecond(now time.Time) float64 {
	k := 0
	var newest, oldest time.Time
	for i := d.n - 1; i >= 0 && i >= d.n-drainSamples; i-- {
		t := d.times[i%drainSamples]
		if now.Sub(t) > drainWindow {
			break
		}
		if k == 0 {
			newest = t
		}
		oldest, k = t, k+1
	}
	span := newest.Sub(oldest)
	if k < 2 || span <= 0 {
		return 0
	}
	return float64(k-1) / span.Seconds()
}

// timeFor is how long n more releases take at the measured rate, between 1s and 5 minutes;
// clamped in float, since n over a tiny rate overflows a Duration.
func (d *drainRate) timeFor(n int, now time.Time) time.Duration {
	rate := d.perSecond(now)
	if rate <= 0 {
		return time.Second
	}
	secs := min(max(float64(n)/rate, 1), 300)
	return time.Duration(secs * float64(time.Second))
}

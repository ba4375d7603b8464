package module

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/internal/capacity"
)

// seatPools holds the seats of every capacity block in this process, keyed by the upstream the
// block guards (seatPoolKey). They are process-wide, not per config: a call that started under
// the old config keeps its seat through a reload, and the new config's calls count against
// the same seats (docs/capacity.md).
var seatPools = caddy.NewUsagePool()

// errNoSeat: no seat came free within the call's wait.
var errNoSeat = capacity.ErrNoSeat

// seatPoolKey identifies a block's upstream across reloads: the storage and the operations
// prefix it serves, which is what makes two blocks one gateway in front of one model server.
func seatPoolKey(where, prefix string) string { return where + "|" + prefix }

// seatAsk is who asks for a seat: the order they wait in (internal/capacity).
type seatAsk = capacity.Ask

// seatWaiter is one ask waiting in the pool.
type seatWaiter = capacity.Waiter

// seatPool is one upstream's seats in this process (capacity.Pool: the local seats and the one
// order their waiters are served in), with the shared seats among replicas when the block has
// `shared`.
type seatPool struct {
	*capacity.Pool
	key   string
	where string // the storage whose runners claim operations for these seats
	label string // how metrics and stats name it: the storage as operators see it, and the prefix

	mu  sync.Mutex
	cfg CapacityConfig

	sharedName string       // the pool's name among replicas (capacity shared)
	shared     *sharedSeats // nil until first needed, or without shared
	watch      *serverWatch // reads the model server's metrics (capacity server_metrics); nil without
}

func newSeatPool(key, where, label, sharedName string, cfg CapacityConfig) *seatPool {
	p := &seatPool{key: key, where: where, label: label, sharedName: sharedName,
		Pool: capacity.NewPool(realClock, localConfig(cfg)), cfg: cfg}
	return p
}

// localConfig is the part of a block's capacity the local pool needs.
func localConfig(cfg CapacityConfig) capacity.Config {
	return capacity.Config{Limit: cfg.Limit, Auto: cfg.Auto, Min: cfg.Min, Max: cfg.Max}
}

// Destruct lets the pool go with the last config. Calls still holding shared seats keep
// them renewed until they end: the renewer runs while any seat is held.
func (p *seatPool) Destruct() error {
	p.mu.Lock()
	w := p.watch
	p.watch = nil
	p.mu.Unlock()
	if w != nil {
		w.close()
	}
	return nil
}

// configure applies a (re)loaded block's settings; seats in use stay in use. The model
// server's metrics are read again from scratch when their settings changed.
func (p *seatPool) configure(cfg CapacityConfig) {
	p.mu.Lock()
	old := p.cfg.ServerMetrics
	p.cfg = cfg
	var stopped *serverWatch
	if p.watch != nil && (cfg.ServerMetrics == nil || old == nil || !sameServerMetrics(*old, *cfg.ServerMetrics)) {
		stopped, p.watch = p.watch, nil
	}
	if p.watch == nil && cfg.ServerMetrics != nil {
		p.watch = startServerWatch(p, *cfg.ServerMetrics, caddy.Log().Named("mulligan.capacity"))
	}
	p.mu.Unlock()
	if stopped != nil {
		stopped.close()
	}
	p.Configure(localConfig(cfg))
}

func sameServerMetrics(a, b ServerMetricsConfig) bool {
	return a.URL == b.URL && a.Server == b.Server && a.Interval == b.Interval && *a.MaxWaiting == *b.MaxWaiting && a.MaxKVCache == b.MaxKVCache
}

// watching reports whether the pool reads its model server's metrics.
func (p *seatPool) watching() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.watch != nil
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
	return p.withShared(ctx, s, w.Ask, deadline)
}

// withShared adds a shared seat to local seat s when the pool has `shared`, waiting no later
// than deadline (zero: until ctx ends). When none is free at once, the local seat goes back
// while the call waits for a shared one, so that it holds no seat an urgent call of this
// replica needs, and is taken again, in ask's place, once the shared seat is (docs/capacity.md).
func (p *seatPool) withShared(ctx context.Context, s *seat, ask seatAsk, deadline time.Time) (*seat, error) {
	shared := p.sharedFor()
	if shared == nil {
		return s, nil
	}
	urgency := ask.Band(time.Now())
	h, err := shared.take(ctx, time.Now(), urgency) // one look
	if err == nil {
		s.shared, s.from = h, shared
		return s, nil
	}
	s.giveBack()
	if !errors.Is(err, errNoSeat) {
		return nil, err
	}
	if h, err = shared.take(ctx, deadline, urgency); err != nil {
		return nil, err
	}
	var wait time.Duration
	if !deadline.IsZero() {
		wait = max(time.Until(deadline), time.Millisecond)
	}
	local, err := p.await(ctx, p.enqueue(ask), wait)
	if err != nil {
		shared.give(h)
		return nil, err
	}
	local.shared, local.from = h, shared
	return local, nil
}

// enqueue puts ask in the order, granting it a seat at once when one is free and nobody waits.
func (p *seatPool) enqueue(ask seatAsk) *seatWaiter { return p.Enqueue(ask) }

// await waits for w's seat up to wait (zero: until ctx ends); on failure w leaves the order.
func (p *seatPool) await(ctx context.Context, w *seatWaiter, wait time.Duration) (*seat, error) {
	began := time.Now()
	defer func() { capacityMetrics.seatWait.Observe(time.Since(began).Seconds()) }()
	start, err := p.Await(ctx, w, wait)
	if err != nil {
		return nil, err
	}
	return &seat{pool: p, start: start}, nil
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

// release gives the seat back, telling the adaptive limit how the call went (docs/capacity.md,
// "limit auto").
func (s *seat) release(sample capacity.Sample) {
	s.once.Do(func() {
		p := s.pool
		if s.shared != nil {
			// After the local seat is back: a failed give must not leak it.
			defer s.from.give(s.shared)
		}
		p.Release(s.start, sample)
		kickRunners(p.where) // a seat may be free for queued work
	})
}

// giveBack returns a seat that was never used for a call, shared seat included: it tells the
// limit nothing. A nil seat is none.
func (s *seat) giveBack() {
	if s == nil {
		return
	}
	s.once.Do(func() {
		if s.shared != nil {
			defer s.from.give(s.shared)
		}
		s.pool.GiveBack()
		kickRunners(s.pool.where)
	})
}

// retryAfter estimates when a refused call may find a seat.
func (p *seatPool) retryAfter() time.Duration { return p.RetryAfter() }

// seatSnapshot is a pool's state for metrics and /mulligan/stats.
type seatSnapshot = capacity.Snapshot

func (p *seatPool) snapshot() seatSnapshot { return p.Snapshot() }

// countRefusal counts a sync call answered 503 UPSTREAM_SATURATED (a call queued instead is
// not refused).
func (p *seatPool) countRefusal() {
	capacityMetrics.refusals.Inc()
	p.CountRefusal()
}

func (p *seatPool) countQueueTimeout() { p.CountQueueTimeout() }

package module

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/store"
)

// errNoSeat: no seat came free within the call's wait.
var errNoSeat = capacity.ErrNoSeat

// seatPoolKey identifies a block's upstream across reloads: the storage and the operations
// prefix it serves, which is what makes two blocks one gateway in front of one model server.
func seatPoolKey(where, prefix string) string { return where + "|" + prefix }

// seatAsk is who asks for a seat: the order they wait in (internal/capacity).
type seatAsk = capacity.Ask

// seat is one held seat, with its shared seat under `shared` (internal/capacity).
type seat = capacity.Seat

// seatPool is one upstream's seats in this process (capacity.Upstream), as a block's config and
// storage set them up: the runners of its storage woken when a seat comes free, the shared seats
// found in its storage once it has started.
type seatPool struct {
	*capacity.Upstream
	reg   *registry // where it is kept, with the storage at where
	key   string
	where string // the storage whose runners claim operations for these seats
	label string // how metrics and stats name it: the storage as operators see it, and the prefix

	passPriority atomic.Value // string: the block's pass_priority

	sharedMu sync.Mutex
	shared   *capacity.Shared // the pool's shared seats, once found (findSharedSeats)
	sharedOn *storage         // the handle they are taken through
}

func newSeatPool(reg *registry, key, where, label, sharedName string, cfg CapacityConfig) *seatPool {
	p := &seatPool{reg: reg, key: key, where: where, label: label}
	p.Upstream = capacity.NewUpstream(localConfig(cfg), capacity.UpstreamOptions{
		Seats: capacity.SeatsOptions{
			Clock:  realClock,
			OnFree: p.kickRunners,
			Waited: func(d time.Duration) { capacityMetrics.seatWait.Observe(d.Seconds()) },
		},
		Watch: capacity.WatchOptions{Clock: realClock, Log: caddy.Log().Named("mulligan.capacity"), Client: serverMetricsClient,
			Read: func(err error) {
				if err != nil {
					capacityMetrics.serverReadFailures.Inc()
				}
			}},
		FindShared: func(limit int) *capacity.Shared { return p.findSharedSeats(sharedName, limit) },
	})
	return p
}

// localConfig is the part of a block's capacity the local pool needs.
func localConfig(cfg CapacityConfig) capacity.Config {
	return capacity.Config{Limit: cfg.Limit, Auto: cfg.Auto, Min: cfg.Min, Max: cfg.Max}
}

// Destruct lets the pool go with the last config.
func (p *seatPool) Destruct() error {
	p.Close()
	return nil
}

// configure applies a (re)loaded block's settings; seats in use stay in use.
func (p *seatPool) configure(cfg CapacityConfig) {
	p.passPriority.Store(cfg.PassPriority)
	var watch *capacity.WatchConfig
	if m := cfg.ServerMetrics; m != nil {
		watch = &capacity.WatchConfig{Label: p.label, URL: m.URL, Names: capacity.ServerMetricNames[m.Server],
			Every: time.Duration(m.Interval), Saturation: capacity.Saturation{MaxWaiting: *m.MaxWaiting, MaxKVCache: m.MaxKVCache}}
	}
	p.Configure(localConfig(cfg), watch, cfg.Shared)
}

// serverMetricsClient reads the model servers' metrics.
var serverMetricsClient = &http.Client{}

// findSharedSeats returns the shared seats named name of the pool's storage, once it has
// started and if it shares seats: leased as the storage leases operations (internal/runner),
// named as the gateway names its ids. They outlive the handle they are found through: as it
// closes, they move to another (moveSharedSeats).
func (p *seatPool) findSharedSeats(name string, limit int) *capacity.Shared {
	p.sharedMu.Lock()
	defer p.sharedMu.Unlock()
	_, open := p.reg.storagesAt(p.where)
	for _, s := range open {
		if ss, ok := s.be.(store.SharedSeats); ok {
			p.shared, p.sharedOn = newSharedSeats(ss, name, s.run.Worker(), limit, s.run.Settings().Takeover, s.run.Log()), s
			return p.shared
		}
	}
	return nil
}

// moveSharedSeats moves the pool's shared seats off gone, a handle about to close, to another
// open handle on the same storage: a reload that changed how the storage is opened (durability,
// the direct DSN) opens a second handle and closes the first once the old config lets go, while
// the seats, like the pool, outlive the reload. Left on the closed handle, every look and renewal
// failed, and every call the block covers was answered 503 until a restart.
func (p *seatPool) moveSharedSeats(gone *storage) {
	p.sharedMu.Lock()
	defer p.sharedMu.Unlock()
	if p.sharedOn != gone {
		return
	}
	_, open := p.reg.storagesAt(p.where)
	for _, s := range open {
		if ss, ok := s.be.(store.SharedSeats); ok && s != gone {
			p.shared.Rebind(ss)
			p.sharedOn = s
			return
		}
	}
}

// newSharedSeats is a pool's shared seats in st, leased as the storage leases operations
// (internal/runner), named as the gateway names its ids.
func newSharedSeats(st store.SharedSeats, name, worker string, limit int, lease time.Duration, log *zap.Logger) *capacity.Shared {
	return capacity.NewShared(st, capacity.SharedOptions{Name: name, Worker: worker, Limit: limit,
		Lease: lease, Margin: runner.LeaseMargin(lease), Renew: runner.RenewEvery(lease), Clock: realClock, Log: log,
		NewID: func(now time.Time) string { return newID("seat_", now) }})
}

// seatSnapshot is a pool's state for metrics and /mulligan/stats.
type seatSnapshot = capacity.Snapshot

// countRefusal counts a sync call answered 503 UPSTREAM_SATURATED (a call queued instead is
// not refused).
func (p *seatPool) countRefusal() {
	capacityMetrics.refusals.Inc()
	p.CountRefusal()
}

// kickRunners wakes the claim loops of the pool's storage: a seat came free.
func (p *seatPool) kickRunners() {
	_, open := p.reg.storagesAt(p.where)
	for _, s := range open {
		s.run.Kick()
	}
}

// storageSeats is the runner's view of the seat pools of the storage at where (runner.Capacity).
type storageSeats struct {
	reg   *registry
	where string
}

func (c storageSeats) Pools() []*capacity.Seats {
	var out []*capacity.Seats
	for _, p := range c.reg.seatPoolsAt(c.where) {
		out = append(out, p.Seats)
	}
	return out
}

func (c storageSeats) Upstream(op *store.Operation, req *store.Request) *store.Request {
	if p := c.reg.seatPool(seatPoolKey(c.where, execOf(op).Prefix)); p != nil {
		return p.passPriorityStored(op, req)
	}
	return req
}

func (c storageSeats) PoolFor(prefix string) *capacity.Seats {
	if p := c.reg.seatPool(seatPoolKey(c.where, prefix)); p != nil {
		return p.Seats
	}
	return nil
}

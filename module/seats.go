package module

import (
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/store"
)

// seatPools holds the seats of every capacity block in this process, keyed by the upstream the
// block guards (seatPoolKey). They are process-wide, not per config: a call that started under
// the old config keeps its seat through a reload, and the new config's calls count against
// the same seats (docs/capacity.md).
var seatPools = caddy.NewUsagePool()

// errNoSeat: no seat came free within the call's wait.
var errNoSeat = capacity.ErrNoSeat

// errSeatLapsed cuts a call whose shared seat could not be renewed before its lease ended.
var errSeatLapsed = capacity.ErrSeatLapsed

// seatPoolKey identifies a block's upstream across reloads: the storage and the operations
// prefix it serves, which is what makes two blocks one gateway in front of one model server.
func seatPoolKey(where, prefix string) string { return where + "|" + prefix }

// seatAsk is who asks for a seat: the order they wait in (internal/capacity).
type seatAsk = capacity.Ask

// seat is one held seat, with its shared seat under `shared` (internal/capacity).
type seat = capacity.Seat

// seatPool is one upstream's seats in this process (capacity.Seats), as a block's config and
// storage set them up: the shared seats once the storage has started, the model server's
// metrics while they are configured, and the runners woken when a seat comes free.
type seatPool struct {
	*capacity.Seats
	key   string
	where string // the storage whose runners claim operations for these seats
	label string // how metrics and stats name it: the storage as operators see it, and the prefix

	mu  sync.Mutex
	cfg CapacityConfig

	sharedName string                // the pool's name among replicas (capacity shared)
	shared     *capacity.Shared      // nil until first needed, or without shared
	watch      *capacity.ServerWatch // reads the model server's metrics (capacity server_metrics); nil without
}

func newSeatPool(key, where, label, sharedName string, cfg CapacityConfig) *seatPool {
	p := &seatPool{key: key, where: where, label: label, sharedName: sharedName, cfg: cfg}
	p.Seats = capacity.NewSeats(localConfig(cfg), capacity.SeatsOptions{
		Clock:  realClock,
		Shared: p.sharedFor,
		OnFree: func() { kickRunners(where) },
		Waited: func(d time.Duration) { capacityMetrics.seatWait.Observe(d.Seconds()) },
	})
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
		w.Close()
	}
	return nil
}

// configure applies a (re)loaded block's settings; seats in use stay in use. The model
// server's metrics are read again from scratch when their settings changed.
func (p *seatPool) configure(cfg CapacityConfig) {
	p.mu.Lock()
	old := p.cfg.ServerMetrics
	p.cfg = cfg
	var stopped *capacity.ServerWatch
	if p.watch != nil && (cfg.ServerMetrics == nil || old == nil || !sameServerMetrics(*old, *cfg.ServerMetrics)) {
		stopped, p.watch = p.watch, nil
	}
	if p.watch == nil && cfg.ServerMetrics != nil {
		p.watch = p.startWatch(*cfg.ServerMetrics)
	}
	p.mu.Unlock()
	if stopped != nil {
		stopped.Close()
	}
	p.Configure(localConfig(cfg))
}

// serverMetricsClient reads the model servers' metrics.
var serverMetricsClient = &http.Client{}

// startWatch reads the model server's metrics of m for p (docs/capacity.md, "The model server's
// metrics").
func (p *seatPool) startWatch(m ServerMetricsConfig) *capacity.ServerWatch {
	cfg := capacity.WatchConfig{Label: p.label, URL: m.URL, Names: capacity.ServerMetricNames[m.Server],
		Every: time.Duration(m.Interval), Saturation: capacity.Saturation{MaxWaiting: *m.MaxWaiting, MaxKVCache: m.MaxKVCache}}
	return capacity.StartServerWatch(p.Pool, cfg, capacity.WatchOptions{Clock: realClock,
		Log: caddy.Log().Named("mulligan.capacity"), Client: serverMetricsClient,
		Read: func(err error) {
			if err != nil {
				capacityMetrics.serverReadFailures.Inc()
			}
		}})
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

// sharedFor finds the shared seats of p once its storage is open: nil without `shared`, or
// before the storage has started.
func (p *seatPool) sharedFor() *capacity.Shared {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.Shared == 0 {
		return nil
	}
	if p.shared != nil {
		p.shared.SetLimit(p.cfg.Shared)
		return p.shared
	}
	openStorages.Range(func(_, v any) bool {
		s, ok := v.(*storage)
		if !ok || s.set.where() != p.where {
			return true
		}
		if ss, ok := s.be.(store.SharedSeats); ok {
			p.shared = newSharedSeats(ss, p.sharedName, s.run.Worker(), p.cfg.Shared, s.run.Settings().Takeover, s.run.Log())
		}
		return false
	})
	return p.shared
}

// newSharedSeats is a pool's shared seats in st, leased as the storage leases operations
// (internal/runner), named as the gateway names its ids.
func newSharedSeats(st store.SharedSeats, name, worker string, limit int, lease time.Duration, log *zap.Logger) *capacity.Shared {
	return capacity.NewShared(st, capacity.SharedOptions{Name: name, Worker: worker, Limit: limit,
		Lease: lease, Margin: runner.LeaseMargin(lease), Renew: runner.RenewEvery(lease), Clock: realClock, Log: log,
		NewID: func(now time.Time) string { return newID("seat_", now) }})
}

// sharedSnapshot reads p's shared seats; nil without `shared` (or before its storage opened).
func (p *seatPool) sharedSnapshot() *sharedSnapshot {
	s := p.sharedFor()
	if s == nil {
		return nil
	}
	snap := s.Snapshot()
	return &snap
}

// seatSnapshot is a pool's state for metrics and /mulligan/stats.
type seatSnapshot = capacity.Snapshot

// countRefusal counts a sync call answered 503 UPSTREAM_SATURATED (a call queued instead is
// not refused).
func (p *seatPool) countRefusal() {
	capacityMetrics.refusals.Inc()
	p.CountRefusal()
}

// sharedSnapshot is what /mulligan/stats and the metrics show of a pool's shared seats.
type sharedSnapshot = capacity.SharedSnapshot

// lookupSeatPool returns the seats of key, nil when no block has them.
func lookupSeatPool(key string) *seatPool {
	var found *seatPool
	seatPools.Range(func(k, v any) bool {
		if k == key {
			found, _ = v.(*seatPool)
			return false
		}
		return true
	})
	return found
}

// seatPoolsOf lists the seat pools whose operations the storage at where holds.
func seatPoolsOf(where string) []*seatPool {
	var pools []*seatPool
	seatPools.Range(func(_, v any) bool {
		if p, ok := v.(*seatPool); ok && p.where == where {
			pools = append(pools, p)
		}
		return true
	})
	return pools
}

// kickRunners wakes the claim loops of the storage at where: a seat came free.
func kickRunners(where string) {
	openStorages.Range(func(_, v any) bool {
		if s, ok := v.(*storage); ok && s.set.where() == where {
			s.run.Kick()
		}
		return true
	})
}

// storageSeats is the runner's view of the seat pools of the storage at where (runner.Capacity).
type storageSeats string

func (where storageSeats) Pools() []*capacity.Seats {
	var out []*capacity.Seats
	for _, p := range seatPoolsOf(string(where)) {
		out = append(out, p.Seats)
	}
	return out
}

func (where storageSeats) Upstream(op *store.Operation, req *store.Request) *store.Request {
	if p := lookupSeatPool(seatPoolKey(string(where), execOf(op).Prefix)); p != nil {
		return p.passPriorityStored(op, req)
	}
	return req
}

func (where storageSeats) PoolFor(prefix string) *capacity.Seats {
	if p := lookupSeatPool(seatPoolKey(string(where), prefix)); p != nil {
		return p.Seats
	}
	return nil
}

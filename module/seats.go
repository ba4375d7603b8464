package module

import (
	"net/http"
	"sync/atomic"
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
	key   string
	where string // the storage whose runners claim operations for these seats
	label string // how metrics and stats name it: the storage as operators see it, and the prefix

	passPriority atomic.Value // string: the block's pass_priority
}

func newSeatPool(key, where, label, sharedName string, cfg CapacityConfig) *seatPool {
	p := &seatPool{key: key, where: where, label: label}
	p.Upstream = capacity.NewUpstream(localConfig(cfg), capacity.UpstreamOptions{
		Seats: capacity.SeatsOptions{
			Clock:  realClock,
			OnFree: func() { kickRunners(where) },
			Waited: func(d time.Duration) { capacityMetrics.seatWait.Observe(d.Seconds()) },
		},
		Watch: capacity.WatchOptions{Clock: realClock, Log: caddy.Log().Named("mulligan.capacity"), Client: serverMetricsClient,
			Read: func(err error) {
				if err != nil {
					capacityMetrics.serverReadFailures.Inc()
				}
			}},
		FindShared: func(limit int) *capacity.Shared { return findSharedSeats(where, sharedName, limit) },
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

// findSharedSeats returns the shared seats named name of the storage at where, once it has
// started and if it shares seats: leased as the storage leases operations (internal/runner),
// named as the gateway names its ids.
func findSharedSeats(where, name string, limit int) *capacity.Shared {
	var found *capacity.Shared
	openStorages.Range(func(_, v any) bool {
		s, ok := v.(*storage)
		if !ok || s.set.where() != where {
			return true
		}
		if ss, ok := s.be.(store.SharedSeats); ok {
			found = newSharedSeats(ss, name, s.run.Worker(), limit, s.run.Settings().Takeover, s.run.Log())
		}
		return false
	})
	return found
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

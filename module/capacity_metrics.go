package module

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mulligan-gw/mulligan/store"
)

// Capacity's metrics (docs/capacity.md), created once per process like the others.
var capacityMetrics = struct {
	seatWait      prometheus.Histogram
	refusals      prometheus.Counter
	queueTimeouts prometheus.Counter
	// serverReadFailures counts reads of a model server's metrics that failed (server_metrics).
	serverReadFailures prometheus.Counter
	pools              prometheus.Collector
}{
	seatWait: prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "mulligan", Name: "capacity_seat_wait_seconds",
		Help: "Time a call (sync or an operation's attempt) waited for an upstream seat, including calls that got none.", Buckets: prometheus.ExponentialBuckets(0.001, 3, 13),
	}),
	refusals: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "capacity_refusals_total",
		Help: "Sync calls that found no upstream seat within their wait and were answered 503 UPSTREAM_SATURATED (a call that became an operation instead is not counted).",
	}),
	queueTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "capacity_queue_timeouts_total",
		Help: "Operations failed QUEUE_TIMEOUT: they waited past max_queue_wait or Max-Queue-Wait and never reached the upstream.",
	}),
	serverReadFailures: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "capacity_server_metrics_failures_total",
		Help: "Reads of a model server's metrics endpoint (capacity server_metrics) that failed: unreachable, slow, not 200, or without the queue's gauge.",
	}),
	pools: seatCollector{},
}

// seatCollector reads every seat pool at scrape time.
type seatCollector struct{}

var (
	descSeatLimit       = prometheus.NewDesc("mulligan_capacity_limit", "Upstream seats of this replica (the adaptive limit's current value with limit auto).", []string{"pool"}, nil)
	descSeatsInUse      = prometheus.NewDesc("mulligan_capacity_seats_in_use", "Calls holding an upstream seat now.", []string{"pool"}, nil)
	descSeatWaiting     = prometheus.NewDesc("mulligan_capacity_waiting", "Calls and claimed operations waiting for a seat in this replica, by the urgency they wait at (u=0 most urgent; an untrusted u=0..2 counts as 3, and low urgency ages).", []string{"pool", "urgency"}, nil)
	descQueuedUrg       = prometheus.NewDesc("mulligan_capacity_queued", "Operations waiting in the durable queue, by urgency, storage-wide.", []string{"storage", "urgency"}, nil)
	descServerFresh     = prometheus.NewDesc("mulligan_capacity_server_metrics_fresh", "1 while the model server's own metrics steer the adaptive limit (capacity server_metrics), 0 while they are stale or unreachable and latency steers it.", []string{"pool"}, nil)
	descSharedLimit     = prometheus.NewDesc("mulligan_capacity_shared_limit", "Seats shared by every replica on the storage (capacity shared N).", []string{"pool"}, nil)
	descSharedHeld      = prometheus.NewDesc("mulligan_capacity_shared_held", "Shared seats held: by this replica (holder=\"replica\"), or by every replica as the storage counts them (holder=\"fleet\", the same on each replica: do not sum it).", []string{"pool", "holder"}, nil)
	descSharedFleetWait = prometheus.NewDesc("mulligan_capacity_shared_fleet_waiting", "Calls of every replica waiting for a shared seat, by urgency, as their places in the fleet's line last said (the same on each replica: do not sum it).", []string{"pool", "urgency"}, nil)
	descSharedWait      = prometheus.NewDesc("mulligan_capacity_shared_waiting", "Calls of this replica waiting for a shared seat, by urgency (a call that waits holds no local seat; one that only looks once, as a sync call about to become an operation, holds its own); sum across replicas for the fleet.", []string{"pool", "urgency"}, nil)
	descServerWait      = prometheus.NewDesc("mulligan_capacity_server_waiting", "Requests waiting in the model server's own queue, as its metrics said last (while fresh).", []string{"pool"}, nil)
)

func (seatCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSeatLimit, descSeatsInUse, descSeatWaiting, descQueuedUrg, descServerFresh, descServerWait, descSharedLimit, descSharedHeld, descSharedWait, descSharedFleetWait} {
		ch <- d
	}
}

func (seatCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range caddyRegistry.seatPoolsAt("") {
		s := p.Snapshot()
		ch <- prometheus.MustNewConstMetric(descSeatLimit, prometheus.GaugeValue, float64(s.Limit), p.label)
		ch <- prometheus.MustNewConstMetric(descSeatsInUse, prometheus.GaugeValue, float64(s.InUse), p.label)
		for u, n := range s.Waiting {
			ch <- prometheus.MustNewConstMetric(descSeatWaiting, prometheus.GaugeValue, float64(n), p.label, strconv.Itoa(u))
		}
		if ss := p.SharedSnapshot(); ss != nil {
			ch <- prometheus.MustNewConstMetric(descSharedLimit, prometheus.GaugeValue, float64(ss.Limit), p.label)
			ch <- prometheus.MustNewConstMetric(descSharedHeld, prometheus.GaugeValue, float64(ss.Held), p.label, "replica")
			if ss.Fleet != nil {
				ch <- prometheus.MustNewConstMetric(descSharedHeld, prometheus.GaugeValue, float64(*ss.Fleet), p.label, "fleet")
			}
			for u, n := range ss.Waiting {
				ch <- prometheus.MustNewConstMetric(descSharedWait, prometheus.GaugeValue, float64(n), p.label, strconv.Itoa(u))
			}
			if ss.FleetWaiting != nil {
				for u, n := range ss.FleetWaiting {
					ch <- prometheus.MustNewConstMetric(descSharedFleetWait, prometheus.GaugeValue, float64(n), p.label, strconv.Itoa(u))
				}
			}
		}
		if p.Watching() {
			fresh := 0.0
			if s.Server != nil {
				fresh = 1
				ch <- prometheus.MustNewConstMetric(descServerWait, prometheus.GaugeValue, s.Server.Waiting, p.label)
			}
			ch <- prometheus.MustNewConstMetric(descServerFresh, prometheus.GaugeValue, fresh, p.label)
		}
	}
	caddyRegistry.eachStorage(func(_ string, s *storage) bool {
		if counts, err := s.be.QueuedByUrgency(); err == nil {
			for u, n := range counts {
				ch <- prometheus.MustNewConstMetric(descQueuedUrg, prometheus.GaugeValue, float64(n), s.set.name(), strconv.Itoa(u))
			}
		}
		return true
	})
}

// queuePosition estimates op's place in the queue while it is queued; nil when it is not, or
// the backend cannot tell.
func queuePosition(st store.Queue, op *store.Operation) *int {
	if op.Status != store.StatusQueued {
		return nil
	}
	n, err := st.QueuePosition(op.ID)
	if err != nil {
		return nil
	}
	return &n
}

// capacityStats is /mulligan/stats' capacity section (docs/capacity.md): this replica's seats
// per pool, and the storage-wide queue by urgency; nil without capacity.
func capacityStats(st store.Backend, pools []*seatPool) map[string]any {
	if len(pools) == 0 {
		return nil
	}
	replica := map[string]seatSnapshot{}
	shared := map[string]any{}
	for _, p := range pools {
		replica[p.label] = p.Snapshot()
		if ss := p.SharedSnapshot(); ss != nil {
			shared[p.label] = ss
		}
	}
	out := map[string]any{"replica": replica}
	if len(shared) > 0 {
		out["shared"] = shared
	}
	if counts, err := st.QueuedByUrgency(); err == nil {
		out["queued_by_urgency"] = counts
	}
	return out
}

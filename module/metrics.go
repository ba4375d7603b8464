package module

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mulligan-gw/mulligan/internal/batches"
	"github.com/mulligan-gw/mulligan/store"
)

// Metrics are created once per process and registered in every config's registry (Caddy makes
// a new one per config load), tolerating a second registration within one config. Counters
// therefore keep counting across reloads.
var metrics = struct {
	requests      *prometheus.CounterVec
	submitted     *prometheus.CounterVec
	polls         prometheus.Counter
	operations    *prometheus.CounterVec
	queueWait     prometheus.Histogram
	execution     prometheus.Histogram
	duration      prometheus.Histogram
	retries       prometheus.Counter
	attempts      *prometheus.CounterVec
	deadLetters   *prometheus.CounterVec
	fsyncBatch    prometheus.Histogram
	runnerMetrics prometheus.Collector
}{
	requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "requests_total",
		Help: "Covered requests by idempotency outcome: new, replayed, in_progress, mismatch, rejected (bad or missing key), passthrough (no key, not async), accepted (became an operation), queue_full, storage_unavailable, rate_limited (over max_per_scope), busy (over max_buffered).",
	}, []string{"outcome"}),
	submitted: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "operations_submitted_total",
		Help: "Operations accepted (answered 202), by operation type.",
	}, []string{"type"}),
	polls: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "operation_polls_total",
		Help: "Status polls: GET of one operation.",
	}),
	operations: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "operations_finished_total",
		Help: "Operations that reached a final status, by status and error code.",
	}, []string{"status", "error_code"}),
	queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "mulligan", Name: "operation_queue_wait_seconds",
		Help: "Time from submission to the start of an operation's execution.", Buckets: prometheus.ExponentialBuckets(0.005, 3, 12),
	}),
	execution: prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "mulligan", Name: "operation_execution_seconds",
		Help: "Time from the start of an operation's execution to its final status.", Buckets: prometheus.ExponentialBuckets(0.01, 3, 12),
	}),
	duration: prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "mulligan", Name: "operation_duration_seconds",
		Help: "Time from submission to an operation's final status.", Buckets: prometheus.ExponentialBuckets(0.01, 3, 14),
	}),
	retries: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "upstream_retries_total", Help: "Upstream attempts of operations beyond the first.",
	}),
	attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "webhook_attempts_total",
		Help: "Webhook delivery attempts by endpoint and result: delivered, retry_later, disabled, dead_letter.",
	}, []string{"endpoint", "result"}),
	deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "webhook_dead_letters_total", Help: "Webhook events dead-lettered, by endpoint.",
	}, []string{"endpoint"}),
	fsyncBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "mulligan", Name: "store_fsync_batch_size",
		Help: "Durable writes covered by one fsync (group commit) of Badger storage; PostgreSQL syncs its own commits and counts none here.", Buckets: prometheus.ExponentialBuckets(1, 2, 10),
	}),
	runnerMetrics: runnerCollector{},
}

// Request outcomes, the values of mulligan_requests_total's label.
const (
	outcomeNew         = "new"
	outcomeReplayed    = "replayed"
	outcomeInProgress  = "in_progress"
	outcomeMismatch    = "mismatch"
	outcomeRejected    = "rejected"
	outcomePassthrough = "passthrough"
	outcomeAccepted    = "accepted"
	outcomeQueueFull   = "queue_full"
	outcomeStorage     = "storage_unavailable"
	outcomeRateLimited = "rate_limited"
	outcomeBusy        = "busy"
)

func countRequest(outcome string) { metrics.requests.WithLabelValues(outcome).Inc() }

// countSubmitted records an accepted operation under its type.
func countSubmitted(op *store.Operation) { metrics.submitted.WithLabelValues(operationType(op)).Inc() }

// operationType is the type an operation is counted under: its block's async type, else the
// path it was submitted to.
func operationType(op *store.Operation) string {
	if op.Type != "" {
		return op.Type
	}
	return op.Path
}

// countFinal records an operation that reached a final status.
func countFinal(op *store.Operation) {
	if op.Batch != nil {
		batches.CountLine(op)
	}
	code := ""
	if op.Error != nil {
		code = op.Error.Code
	}
	metrics.operations.WithLabelValues(string(op.Status), code).Inc()
	if !op.StartedAt.IsZero() && !op.FinishedAt.IsZero() {
		metrics.execution.Observe(op.FinishedAt.Sub(op.StartedAt).Seconds())
	}
	if !op.SubmittedAt.IsZero() && !op.FinishedAt.IsZero() {
		metrics.duration.Observe(op.FinishedAt.Sub(op.SubmittedAt).Seconds())
	}
}

var registerOnce sync.Mutex

// collectors lists every Mulligan collector.
func collectors() []prometheus.Collector {
	return append([]prometheus.Collector{metrics.requests, metrics.submitted, metrics.polls, metrics.operations,
		metrics.queueWait, metrics.execution, metrics.duration, metrics.retries, metrics.attempts, metrics.deadLetters,
		metrics.fsyncBatch, metrics.runnerMetrics,
		capacityMetrics.seatWait, capacityMetrics.refusals, capacityMetrics.queueTimeouts, capacityMetrics.serverReadFailures, capacityMetrics.pools}, batches.Collectors()...)
}

// registerMetrics adds Mulligan's collectors to a config's registry.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	registerOnce.Lock()
	defer registerOnce.Unlock()
	for _, c := range collectors() {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}

// runnerCollector reads the runners' state at scrape time.
type runnerCollector struct{}

var (
	descQueue   = prometheus.NewDesc("mulligan_queue_depth", "Operations waiting in the storage's queue: storage-wide, the same on every replica (take max by storage, not sum).", []string{"storage"}, nil)
	descRunning = prometheus.NewDesc("mulligan_operations_running", "Operations this process is executing: per process (sum across replicas).", []string{"storage"}, nil)
	descOldest  = prometheus.NewDesc("mulligan_oldest_running_operation_age_seconds", "How long the longest-running operation of this process has been executing (0 when none is).", []string{"storage"}, nil)
	descPending = prometheus.NewDesc("mulligan_webhook_events_pending", "Webhook events waiting for delivery.", []string{"storage"}, nil)
	descDead    = prometheus.NewDesc("mulligan_webhook_events_dead", "Webhook events in the dead-letter list.", []string{"storage"}, nil)
	descBreaker = prometheus.NewDesc("mulligan_webhook_breaker_state", "Circuit breaker state per endpoint: 0 closed, 1 half-open, 2 open.", []string{"storage", "endpoint"}, nil)
	descSize    = prometheus.NewDesc("mulligan_store_size_bytes", "Size of the storage in bytes, as well as the backend can tell (Badger: LSM and value log on disk).", []string{"storage"}, nil)
)

func (runnerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueue, descRunning, descOldest, descPending, descDead, descBreaker, descSize} {
		ch <- d
	}
}

func (runnerCollector) Collect(ch chan<- prometheus.Metric) {
	var list []*storage
	caddyRegistry.eachStorage(func(_ string, s *storage) bool {
		list = append(list, s)
		return true
	})
	for _, s := range list {
		r, name := s.run, s.set.name()
		running, oldest := r.RunningSince()
		// Storage-wide: counted in the storage at scrape time, so every replica shows the same
		// queue (never this process's own tally of what it accepted and claimed).
		if queued, _, err := r.Store().QueueStats(); err == nil {
			ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(queued), name)
		}
		ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(running), name)
		age := 0.0
		if !oldest.IsZero() {
			age = r.Clock().Since(oldest).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, age, name)
		if pending, dead, err := r.Store().CountEvents(); err == nil {
			ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(pending), name)
			ch <- prometheus.MustNewConstMetric(descDead, prometheus.GaugeValue, float64(dead), name)
		}
		ch <- prometheus.MustNewConstMetric(descSize, prometheus.GaugeValue, float64(s.be.Size()), name)
		for endpoint, state := range r.Courier().Breakers() {
			ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, breakerValue[state], name, endpoint)
		}
	}
}

var breakerValue = map[string]float64{"closed": 0, "half-open": 1, "open": 2}

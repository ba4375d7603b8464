package module

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mulligan-gw/mulligan/store"
)

// batchMetrics are the Files and Batches API's metrics (docs/batches.md), created once per
// process like the others.
var batchMetrics = struct {
	files    prometheus.Counter
	created  prometheus.Counter
	finished *prometheus.CounterVec
	active   *prometheus.GaugeVec
	lines    *prometheus.CounterVec
}{
	files: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "batch_files_uploaded_total", Help: "Files uploaded through the Files API.",
	}),
	created: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "batches_created_total", Help: "Batches created.",
	}),
	finished: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "batches_finished_total",
		Help: "Batches that reached a final status (completed, failed, expired, cancelled), as seen by this replica's batch worker.",
	}, []string{"status"}),
	active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "mulligan", Name: "batches", Help: "Batches not final, by status (validating, in_progress, cancelling), storage-wide.",
	}, []string{"status"}),
	lines: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "batch_lines_finished_total",
		Help: "Batch lines that reached a final status, by outcome: succeeded, failed, cancelled, expired.",
	}, []string{"outcome"}),
}

func batchCollectors() []prometheus.Collector {
	return []prometheus.Collector{batchMetrics.files, batchMetrics.created, batchMetrics.finished, batchMetrics.active, batchMetrics.lines}
}

// countLineFinal counts a batch line's final status by outcome.
func countLineFinal(op *store.Operation) {
	outcome := string(op.Status)
	if op.Status == store.StatusCanceled {
		outcome = "cancelled"
		if op.Error != nil && op.Error.Code == store.LineExpired {
			outcome = "expired"
		}
	}
	batchMetrics.lines.WithLabelValues(outcome).Inc()
}

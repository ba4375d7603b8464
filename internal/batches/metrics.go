package batches

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
)

// metrics are the Files and Batches API's metrics (docs/batches.md), created once per
// process like the others; Collectors hands them to the gateway's registry.
var metrics = struct {
	files    prometheus.Counter
	created  prometheus.Counter
	finished *prometheus.CounterVec
	active   *prometheus.GaugeVec
	lines    *prometheus.CounterVec
	// inputRead shows an input file is read about twice (validation, then line creation),
	// not once per window of lines.
	inputRead prometheus.Counter
}{
	files: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "batch_files_uploaded_total", Help: "Files uploaded through the Files API.",
	}),
	created: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "batches_created_total", Help: "Batches created.",
	}),
	finished: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "batches_finished_total",
		Help: "Batches that reached a final status (completed, failed, expired, cancelled), counted by the replica whose transaction settled each.",
	}, []string{"status"}),
	active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "mulligan", Name: "batches", Help: "Batches not final, by status (validating, in_progress, cancelling), storage-wide.",
	}, []string{"status"}),
	lines: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "batch_lines_finished_total",
		Help: "Batch lines that reached a final status, by outcome: succeeded, failed, cancelled, expired.",
	}, []string{"outcome"}),
	inputRead: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "mulligan", Name: "batch_input_read_bytes_total",
		Help: "Bytes read from batch input files, by validation and by line creation.",
	}),
}

// Collectors are the batch metrics, for the gateway to register.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{metrics.files, metrics.created, metrics.finished, metrics.active, metrics.lines, metrics.inputRead}
}

// CountUploaded counts a file uploaded through the Files API.
func CountUploaded() { metrics.files.Inc() }

// CountCreated counts a batch created.
func CountCreated() { metrics.created.Inc() }

// CountLine counts a batch line's final status by outcome.
func CountLine(op *store.Operation) {
	outcome := string(op.Status)
	if op.Status == store.StatusCanceled {
		outcome = "cancelled"
		if op.Error != nil && op.Error.Code == store.LineExpired {
			outcome = "expired"
		}
	}
	metrics.lines.WithLabelValues(outcome).Inc()
}

// Settled is every storage's SetBatchSettled function: a batch made final is counted and
// logged once across the replicas on a storage, by the one whose transaction settled it.
func Settled(log *zap.Logger) func(b *store.Batch) {
	log = log.Named("batches")
	return func(b *store.Batch) {
		metrics.finished.WithLabelValues(string(b.Status)).Inc()
		log.Info("batch final", zap.String("batch_id", b.ID), zap.String("status", string(b.Status)),
			zap.Int("completed", b.Counts.Completed), zap.Int("failed", b.Counts.Failed))
	}
}

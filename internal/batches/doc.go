// Package batches is the OpenAI Batch API's engine on a storage (docs/batches.md): the Worker
// that validates a batch's input file, creates its lines as operations in chunks and cuts the
// lines of cancelled and expired batches, and the helpers the API answers with: the input line
// reader and its checks (lines.go), the output and error files assembled from the lines' stored
// results (output.go), the batch object (view.go), the batch.* events (events.go) and the
// batch metrics (metrics.go). It imports neither Caddy nor the module package: module/ routes
// the HTTP calls and hands the worker a storage, a clock and the runner (Lines).
package batches

// Package batches is the OpenAI Files and Batch API's engine on a storage (docs/batches.md):
// the API's calls (api.go, api_files.go, api_batches.go: uploads, quotas, listing, content,
// batch create, read and cancel), the Worker that validates a batch's input file, creates its
// lines as operations in chunks and cuts the lines of cancelled and expired batches, and the
// helpers they answer with: the input line reader and its checks (lines.go), the output and
// error files assembled from the lines' stored results (output.go), the batch object
// (view.go), the batch.* events (events.go) and the batch metrics (metrics.go). It imports
// neither Caddy nor the module package: module/ routes the HTTP calls to a Call, and hands the
// API and the worker a storage, a clock and the runner (Lines).
package batches

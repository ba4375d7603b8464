// Package module is Mulligan's Caddy side: the http.handlers.mulligan handler and its Caddyfile
// directive, the app that owns the storages across config reloads, and the request path. The
// services that work a storage are packages of their own: the runner internal/runner, the
// courier internal/courier, the batch worker internal/batches. Of the
// library packages it alone imports Caddy (the
// sidecar's main and the demo embed Caddy too). Storage is behind store.Backend; what needs only
// the standard library lives in internal/ (fingerprint, idemkey, sse, bodyfields, opview, clocks, ids, reqlog, prefer).
//
// Where each feature is (docs/ has the user's view of each):
//
//	request path        handler.go (the handler, Provision, ServeHTTP), config.go, caddyfile*.go
//	idempotency         idempotency.go (gate: claim, run once, record, replay), recorder.go (the
//	                    tee that records), internal/streams.Flights (duplicates waiting in process)
//	keyed streams       stream_join.go (join, resume); a keyed run's recording (streams.Keyed),
//	                    the broadcasts, the store follower and the one relay are internal/streams
//	async conversion    async.go (accept, after-mode window), prefer.go, metadata.go, admission.go;
//	                    the body's metadata and callback.url are read by internal/bodyfields
//	operations API      operations.go, lookup.go, operations_follow.go (a result's stream, the
//	                    wait for it to begin); the operation's JSON view is internal/opview
//	runner              runner.go (the storage's internal/runner, wired to the gateway's seat
//	                    pools and metrics), dispatch.go (what attempts go through: the config's
//	                    Caddy servers), clock.go
//	webhooks            webhooks_config.go (the config; its checks, endpoints and schedule are
//	                    internal/courier.Setup, URL patterns and secrets webhook/; the events
//	                    are built and rendered by internal/runner), courier.go (the storage's internal/courier, wired to the gateway's
//	                    rendering, traces and metrics)
//	capacity            capacity.go, capacity_fair.go, capacity_server.go (the config),
//	                    capacity_serve.go, seats.go (the process-wide pools, wired to storage and
//	                    metrics), capacity_metrics.go; the seats, classes, shared seats, the
//	                    model server's metrics and the writer that reads an answer for the limit
//	                    are internal/capacity
//	batches and files   batches*.go (the API's routes and objects), files.go; the worker, line
//	                    checks, output assembly, events and metrics are internal/batches
//	storage             storage.go (open storages, shared by configs), app.go, postgres.go
//	operators           admin.go, metrics.go, metrics_zero.go, health.go, logging.go; traces are
//	                    internal/tracing
//	errors              internal/apierr (the one error writer and its catalogue)
package module

package module

import (
	"net/http"
	"time"

	"github.com/mulligan-gw/mulligan/internal/apierr"
)

// Health paths, served on the gateway's own port for Kubernetes probes.
const (
	// pathLive answers 200 while the handler serves requests.
	pathLive = "/mulligan/livez"
	// pathReady answers 200 when the store answers a read, the runner is running and
	// the queue is below its limit; 503 otherwise, with the reason.
	pathReady = "/mulligan/healthz"
)

func isHealthPath(p string) bool { return p == pathLive || p == pathReady }

// serveHealth answers the probes.
func (h *Handler) serveHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, "GET, HEAD")
		return
	}
	if r.URL.Path == pathLive {
		writeJSON(w, http.StatusOK, map[string]any{"status": "alive"})
		return
	}
	s, done, err := h.storage.acquire()
	if err != nil {
		h.storageFailed(w, err)
		return
	}
	defer done()
	run := s.run
	if err := s.be.Ping(); err != nil {
		h.storageFailed(w, err)
		return
	}
	if !run.Alive() {
		apierr.Write(w, apierr.Error{Code: apierr.CodeStorage, RetryAfter: time.Second, Message: "The operation runner is not running."})
		return
	}
	limit := h.Async.Queue
	if q := run.Queued(); q >= int64(limit) {
		apierr.Write(w, apierr.Error{Code: apierr.CodeQueueFull, RetryAfter: 5 * time.Second, Details: map[string]any{"queued": q, "queue": limit},
			Message: "The operation queue is full."})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "queued": run.Queued(), "queue_limit": limit})
}

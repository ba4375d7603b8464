package modelserver

import (
	"fmt"
	"net/http"
)

// writeMetrics answers GET /metrics with the gauges vLLM publishes about its scheduler, under
// vLLM's names, so a gateway reading a model server's saturation (docs/capacity.md) can be
// tried against this server: the requests in its own queue, those in its slots, and the share
// of its slots in use standing for the KV cache's. Without slots nothing waits and the share is 0.
func (s *Server) writeMetrics(w http.ResponseWriter) {
	st := s.Stats()
	usage := 0.0
	if st.Slots > 0 {
		usage = float64(st.Running) / float64(st.Slots)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	fmt.Fprintf(w, `# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="mock"} %d
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="mock"} %d
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="mock"} %g
`, st.Queued, st.Running, usage)
}

package capacity

import (
	"fmt"
	"io"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The model server's own saturation (docs/capacity.md, "The model server's metrics"): read from
// its Prometheus endpoint, as the Gateway API Inference Extension's saturation detector reads
// it: the requests waiting in the server's own queue and its KV-cache use, against thresholds.

// ServerState is what a model server's metrics say of it now.
type ServerState struct {
	Waiting float64 `json:"waiting"`  // requests in its own queue
	Running float64 `json:"running"`  // requests it is generating for
	KVCache float64 `json:"kv_cache"` // share of its KV cache in use, 0..1; with HasKV only
	HasKV   bool    `json:"has_kv_cache"`
}

// MetricNames are a model server's gauge names for ServerState; KVCache "" when it has none.
type MetricNames struct {
	Waiting, Running, KVCache string
}

// ServerMetricNames are the gauges of the model servers the gateway knows, by name.
var ServerMetricNames = map[string]MetricNames{
	"vllm":     {Waiting: "vllm:num_requests_waiting", Running: "vllm:num_requests_running", KVCache: "vllm:kv_cache_usage_perc"},
	"sglang":   {Waiting: "sglang:num_queue_reqs", Running: "sglang:num_running_reqs", KVCache: "sglang:token_usage"},
	"tgi":      {Waiting: "tgi_queue_size", Running: "tgi_batch_current_size"},
	"llamacpp": {Waiting: "llamacpp:requests_deferred", Running: "llamacpp:requests_processing", KVCache: "llamacpp:kv_cache_usage_ratio"},
}

// vllmKVCacheBefore is the KV-cache gauge of vLLM releases before kv_cache_usage_perc.
const vllmKVCacheBefore = "vllm:gpu_cache_usage_perc"

// ParseServerState reads a Prometheus text exposition for names' gauges, summing a gauge over
// its series (a server serving several models reports one each). A missing waiting gauge is an
// error: the metrics say nothing of the queue.
func ParseServerState(r io.Reader, names MetricNames) (ServerState, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return ServerState{}, fmt.Errorf("reading the model server's metrics: %w", err)
	}
	var st ServerState
	var ok bool
	if st.Waiting, ok = gauge(families, names.Waiting); !ok {
		return ServerState{}, fmt.Errorf("the model server's metrics have no %s", names.Waiting)
	}
	st.Running, _ = gauge(families, names.Running)
	if names.KVCache != "" {
		st.KVCache, st.HasKV = gauge(families, names.KVCache)
		if !st.HasKV && names.KVCache == ServerMetricNames["vllm"].KVCache {
			st.KVCache, st.HasKV = gauge(families, vllmKVCacheBefore)
		}
	}
	return st, nil
}

func gauge(families map[string]*dto.MetricFamily, name string) (float64, bool) {
	f := families[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return 0, false
	}
	total, kv := 0.0, 0.0
	for _, m := range f.GetMetric() {
		switch {
		case m.GetGauge() != nil:
			kv = m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			kv = m.GetUntyped().GetValue()
		case m.GetCounter() != nil:
			kv = m.GetCounter().GetValue()
		default:
			continue
		}
		total += kv
	}
	return total, true
}

// Saturation is when a model server counts as saturated: more than MaxWaiting requests in its
// queue, or its KV cache at MaxKVCache or more (the Inference Extension's defaults: 5 and 0.8).
type Saturation struct {
	MaxWaiting float64
	MaxKVCache float64
}

// Saturated reports whether st is past s's thresholds.
func (s Saturation) Saturated(st ServerState) bool {
	return st.Waiting > s.MaxWaiting || st.HasKV && s.MaxKVCache > 0 && st.KVCache >= s.MaxKVCache
}

// Follow steers the limit by the model server's own saturation instead of latency: cut by
// AIMD's decrease while it is saturated, one more seat while it is not and at least half the
// seats are in use (little traffic says nothing about whether more seats would help). It
// returns the new limit.
func (a *Adaptive) Follow(saturated bool, inUse int) int {
	switch {
	case saturated:
		a.limit = max(a.min, a.limit*adaptBackoff)
	case float64(inUse) >= a.limit/2:
		a.limit = min(a.max, a.limit+1)
	}
	return a.Current()
}

// Follow steers an adaptive limit by the model server's state st, read now; the latency
// signal rests until `until`, when the state counts as stale and the latency signal takes over
// again (docs/capacity.md). A fixed limit is left as it is.
func (p *Pool) Follow(st ServerState, sat Saturation, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.server, p.serverUntil = st, until
	if p.adapt == nil {
		return
	}
	p.limit = p.adapt.Follow(sat.Saturated(st), p.inUse)
	p.grantLocked()
}

// followsServerLocked reports whether the model server's metrics steer the limit now.
func (p *Pool) followsServerLocked(now time.Time) bool { return now.Before(p.serverUntil) }

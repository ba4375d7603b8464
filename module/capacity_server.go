package module

import (
	"fmt"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/internal/capacity"
)

// ServerMetricsConfig names the model server's Prometheus endpoint: while it answers, its own
// saturation (the requests in its queue, its KV-cache use) steers `limit auto` instead of
// latency; stale or unreachable, latency steers again (docs/capacity.md, "The model server's
// metrics").
type ServerMetricsConfig struct {
	// URL is the endpoint, such as http://127.0.0.1:8000/metrics.
	URL string `json:"url"`
	// Server is whose gauge names to read: vllm (default), sglang, tgi or llamacpp.
	Server string `json:"server,omitempty"`
	// Interval is how often it is read. Default: 1s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// MaxWaiting is how many requests may wait in the server's own queue before it counts as
	// saturated. Default: 5, as the Gateway API Inference Extension's saturation detector.
	MaxWaiting *float64 `json:"max_waiting,omitempty"`
	// MaxKVCache is the KV-cache use (0..1) at which it counts as saturated. Default: 0.8.
	MaxKVCache float64 `json:"max_kv_cache,omitempty"`
}

// Server metrics defaults (docs/caddyfile.md).
const (
	defaultServerMetricsEvery = time.Second
	defaultMaxWaiting         = 5
	defaultMaxKVCache         = 0.8
)

func (m *ServerMetricsConfig) setDefaults() {
	if m.Server == "" {
		m.Server = "vllm"
	}
	if m.Interval == 0 {
		m.Interval = caddy.Duration(defaultServerMetricsEvery)
	}
	if m.MaxWaiting == nil {
		n := float64(defaultMaxWaiting)
		m.MaxWaiting = &n
	}
	if m.MaxKVCache == 0 {
		m.MaxKVCache = defaultMaxKVCache
	}
}

func (m *ServerMetricsConfig) validate(auto bool) error {
	u, err := url.Parse(m.URL)
	switch {
	case !auto:
		return fmt.Errorf("capacity: server_metrics steers limit auto; a fixed limit is not steered")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("capacity: server_metrics needs an http or https URL, got %q", m.URL)
	case capacity.ServerMetricNames[m.Server] == (capacity.MetricNames{}):
		return fmt.Errorf("capacity: server_metrics: unknown server %q (vllm, sglang, tgi or llamacpp)", m.Server)
	case m.Interval < 0 || *m.MaxWaiting < 0 || m.MaxKVCache < 0 || m.MaxKVCache > 1:
		return fmt.Errorf("capacity: server_metrics: interval and max_waiting must not be negative, max_kv_cache is from 0 to 1")
	}
	return nil
}

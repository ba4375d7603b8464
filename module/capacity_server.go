package module

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

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
	// serverMetricsStale: reads missed before the metrics count as stale.
	serverMetricsStale = 3
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

// serverWatch reads one pool's model server metrics every interval and steers the pool's limit
// by them; it never holds up a call: a read that fails or is late only lets the metrics go stale.
type serverWatch struct {
	pool *seatPool
	cfg  ServerMetricsConfig
	log  *zap.Logger
	stop chan struct{}
	done chan struct{}

	mu    sync.Mutex
	fresh bool // a read succeeded within the last serverMetricsStale
}

var serverMetricsClient = &http.Client{}

func startServerWatch(p *seatPool, cfg ServerMetricsConfig, log *zap.Logger) *serverWatch {
	w := &serverWatch{pool: p, cfg: cfg, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// close stops the watch and waits for it.
func (w *serverWatch) close() {
	close(w.stop)
	<-w.done
}

func (w *serverWatch) run() {
	defer close(w.done)
	every := time.Duration(w.cfg.Interval)
	t := time.NewTicker(every)
	defer t.Stop()
	missed := 0
	for {
		if err := w.read(every); err != nil {
			capacityMetrics.serverReadFailures.Inc()
			if missed++; missed == serverMetricsStale {
				w.setFresh(false, err)
			}
		} else {
			missed = 0
			w.setFresh(true, nil)
		}
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

// read fetches and applies the metrics once, within every.
func (w *serverWatch) read(every time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), every)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.cfg.URL, nil)
	if err != nil {
		return err
	}
	resp, err := serverMetricsClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the model server's metrics answered %d", resp.StatusCode)
	}
	st, err := capacity.ParseServerState(resp.Body, capacity.ServerMetricNames[w.cfg.Server])
	if err != nil {
		return err
	}
	sat := capacity.Saturation{MaxWaiting: *w.cfg.MaxWaiting, MaxKVCache: w.cfg.MaxKVCache}
	w.pool.Follow(st, sat, time.Now().Add(serverMetricsStale*every))
	return nil
}

// setFresh notes whether the metrics steer the limit, saying so in the log when it changes
// (the metric is mulligan_capacity_server_metrics_fresh).
func (w *serverWatch) setFresh(fresh bool, err error) {
	w.mu.Lock()
	changed := w.fresh != fresh
	w.fresh = fresh
	w.mu.Unlock()
	switch {
	case changed && fresh:
		w.log.Info("the model server's metrics steer the capacity limit", zap.String("pool", w.pool.label), zap.String("url", w.cfg.URL))
	case changed:
		w.log.Warn("the model server's metrics are stale or unreachable; the capacity limit follows latency",
			zap.String("pool", w.pool.label), zap.String("url", w.cfg.URL), zap.Error(err))
	}
}

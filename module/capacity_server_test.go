package module

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// The model server's metrics steer the limit while they answer; unreachable, they never hold up
// a call, and the metric says latency steers.
func TestCapacityServerMetricsSteerTheLimitAndFallBackVisibly(t *testing.T) {
	model := modelserver.New(modelserver.Config{Slots: 2, Latency: 5 * time.Millisecond})
	metrics := httptest.NewServer(model)
	t.Cleanup(metrics.Close)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL + "/metrics"
	dead.Close() // a port nobody answers on
	for _, tc := range []struct {
		name, url string
		fresh     float64
	}{
		{"reachable", metrics.URL + "/metrics", 1},
		{"unreachable", deadURL, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGatewayWith(t, gatewaySetup{upstream: model, globals: quietGlobals,
				mulligan: "capacity {\n limit auto 1 8\n server_metrics " + tc.url + " vllm {\n interval 20ms\n }\n}"})
			name := `mulligan_capacity_server_metrics_fresh{pool="`
			testkit.WaitFor(t, 10*time.Second, "the metrics read", func() bool {
				m := g.scrape(t)
				if tc.fresh == 0 {
					return sum(m, "mulligan_capacity_server_metrics_failures_total") >= capacity.StaleReads && sum(m, name) == 0 && has(m, name)
				}
				return sum(m, name) == 1
			})
			for i := range 5 {
				if r := g.post(chatPath, "", chat("x")); r.err != nil || r.StatusCode != http.StatusOK {
					t.Fatalf("call %d: %v %s", i, r.err, r.body)
				}
			}
		})
	}
}

func has(m map[string]float64, prefix string) bool {
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

func TestCapacityServerMetricsThatCannotBeHonouredAreLoadErrors(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"capacity {\n limit 4\n server_metrics http://127.0.0.1:8000/metrics\n}", "server_metrics steers limit auto"},
		{"capacity {\n server_metrics 127.0.0.1:8000/metrics\n}", "server_metrics needs an http or https URL"},
		{"capacity {\n server_metrics http://127.0.0.1:8000/metrics triton\n}", `unknown server "triton"`},
		{"capacity {\n server_metrics http://h/metrics {\n max_kv_cache 2\n }\n}", "max_kv_cache is from 0 to 1"},
		{"capacity {\n server_metrics http://h/metrics {\n max_waiting many\n }\n}", `max_waiting must be a number, got "many"`},
		{"capacity {\n server_metrics\n}", "server_metrics takes the endpoint's URL"},
	} {
		if err := capacityBlockError(tc.block); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.block, err, tc.want)
		}
	}
}

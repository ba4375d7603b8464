package modelserver_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/capacity"
)

func TestMetricsAreVLLMsGauges(t *testing.T) {
	ts := httptest.NewServer(modelserver.New(modelserver.Config{Slots: 2}))
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	st, err := capacity.ParseServerState(resp.Body, capacity.ServerMetricNames["vllm"])
	if err != nil || st != (capacity.ServerState{HasKV: true}) {
		t.Fatalf("an idle server's metrics: %+v, %v; want nothing waiting or running, a KV cache at 0", st, err)
	}
}

package capacity

import (
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

func TestParseServerStateReadsEachServersGauges(t *testing.T) {
	for _, tc := range []struct {
		server, text string
		want         ServerState
	}{
		{"vllm", `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 3
vllm:num_requests_waiting{model_name="b"} 2
vllm:num_requests_running{model_name="a"} 4
vllm:kv_cache_usage_perc{model_name="a"} 0.5
`, ServerState{Waiting: 5, Running: 4, KVCache: 0.5, HasKV: true}},
		{"vllm", "vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.9\n", ServerState{Waiting: 1, KVCache: 0.9, HasKV: true}},
		{"sglang", "sglang:num_queue_reqs 7\nsglang:num_running_reqs 8\nsglang:token_usage 0.25\n", ServerState{Waiting: 7, Running: 8, KVCache: 0.25, HasKV: true}},
		{"tgi", "# TYPE tgi_queue_size gauge\ntgi_queue_size 2\ntgi_batch_current_size 6\n", ServerState{Waiting: 2, Running: 6}},
		{"llamacpp", "llamacpp:requests_deferred 1\nllamacpp:requests_processing 2\nllamacpp:kv_cache_usage_ratio 0.125\n", ServerState{Waiting: 1, Running: 2, KVCache: 0.125, HasKV: true}},
	} {
		got, err := ParseServerState(strings.NewReader(tc.text), ServerMetricNames[tc.server])
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.server, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "vllm:num_requests_running 3\n", "vllm:num_requests_waiting {{{\n"} {
		if _, err := ParseServerState(strings.NewReader(bad), ServerMetricNames["vllm"]); err == nil {
			t.Errorf("%q: no error; want one (nothing said of the queue)", bad)
		}
	}
}

// While its metrics are fresh the model server's saturation steers the limit, and latency
// does not; once they are stale, latency steers again.
func TestPoolFollowsTheServersSaturationUntilItsMetricsAreStale(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Auto: true, Min: 1, Max: 16})
	sat := Saturation{MaxWaiting: 2, MaxKVCache: 0.8}
	var held []*Waiter
	for range 8 {
		held = append(held, p.Enqueue(Ask{Scope: "a", Since: t0}))
	}
	for range 6 { // the server has room, and the seats are used: one more each time
		p.Follow(ServerState{Waiting: 0, Running: 1}, sat, clock.Now().Add(time.Second))
	}
	if s := p.Snapshot(); s.Limit != 7 || s.Server == nil {
		t.Fatalf("after six reads with room: %+v; want limit 7, the server steering", s)
	}
	p.Follow(ServerState{Waiting: 3}, sat, clock.Now().Add(time.Second))
	p.Follow(ServerState{Waiting: 0, KVCache: 0.9, HasKV: true}, sat, clock.Now().Add(time.Second))
	if s := p.Snapshot(); s.Limit != 5 { // 7 * 0.9 * 0.9
		t.Fatalf("after two saturated reads: limit %d; want 5", s.Limit)
	}
	// Latency says nothing while the metrics are fresh, however slow the calls.
	for i := range 7 {
		if granted(held[i]) {
			p.Release(nil, t0.Add(-time.Hour), Sample{Status: 200})
		}
	}
	if s := p.Snapshot(); s.Limit != 5 {
		t.Fatalf("latency moved the limit to %d while the server's metrics steered it", s.Limit)
	}
	clock.Advance(2 * time.Second)
	if s := p.Snapshot(); s.Server != nil {
		t.Fatalf("stale metrics still shown as steering: %+v", s.Server)
	}
}

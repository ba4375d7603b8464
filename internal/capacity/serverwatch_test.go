package capacity

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// The model server's metrics steer the limit from the first read that answers, and stop
// steering once StaleReads reads in a row have failed, counted on the clock: a failed read
// never cuts short the state the last good one set.
func TestServerWatchSteersUntilStaleReadsHaveFailed(t *testing.T) {
	var down atomic.Bool
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "restarting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "vllm:num_requests_waiting 3\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n")
	}))
	defer model.Close()
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Auto: true, Min: 1, Max: 8})
	reads := make(chan error, 1)
	w := StartServerWatch(p, WatchConfig{Label: "test", URL: model.URL, Names: ServerMetricNames["vllm"], Every: time.Second,
		Saturation: Saturation{MaxWaiting: 5, MaxKVCache: 0.8}},
		WatchOptions{Clock: clock, Log: zap.NewNop(), Client: model.Client(), Read: func(err error) { reads <- err }})
	defer w.Close()
	if err := <-reads; err != nil {
		t.Fatalf("the first read: %v", err)
	}
	if s := p.Snapshot().Server; s == nil || s.Waiting != 3 || s.Running != 2 {
		t.Fatalf("after a read the server is shown as %+v; want 3 waiting, 2 running", s)
	}
	down.Store(true)
	for i := 1; i <= StaleReads; i++ {
		if err := clock.BlockUntilContext(context.Background(), 1); err != nil { // its ticker
			t.Fatal(err)
		}
		clock.Advance(time.Second)
		if err := <-reads; err == nil {
			t.Fatalf("read %d while the server answers 503: no error", i)
		}
		if steers := p.Snapshot().Server != nil; steers != (i < StaleReads) {
			t.Fatalf("after %d failed reads the server's metrics steer: %v; want %v", i, steers, i < StaleReads)
		}
	}
	down.Store(false)
	clock.Advance(time.Second)
	if err := <-reads; err != nil {
		t.Fatalf("the read once the server answers again: %v", err)
	}
	if p.Snapshot().Server == nil {
		t.Fatal("the server's metrics do not steer again after a read that answered")
	}
}

// Metrics that never answered (a wrong URL or port from the start) say so in the log once
// StaleReads reads have failed, as metrics that stop answering do: the log said nothing, and
// only the gauge showed the limit following latency.
func TestServerWatchUnreachableFromTheStartIsLogged(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	defer dead.Close()
	core, logs := observer.New(zapcore.InfoLevel)
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Auto: true, Min: 1, Max: 8})
	reads := make(chan error, 1)
	w := StartServerWatch(p, WatchConfig{Label: "test", URL: dead.URL + "/metrics", Names: ServerMetricNames["vllm"], Every: time.Second},
		WatchOptions{Clock: clock, Log: zap.New(core), Client: dead.Client(), Read: func(err error) { reads <- err }})
	defer w.Close()
	for i := 1; i <= StaleReads; i++ {
		if i > 1 {
			if err := clock.BlockUntilContext(context.Background(), 1); err != nil { // its ticker
				t.Fatal(err)
			}
			clock.Advance(time.Second)
		}
		if err := <-reads; err == nil {
			t.Fatalf("read %d of an endpoint answering 404: no error", i)
		}
		if n, want := logs.FilterLevelExact(zapcore.WarnLevel).Len(), map[bool]int{true: 1, false: 0}[i == StaleReads]; n != want {
			t.Fatalf("after %d failed reads, %d warnings logged; want %d", i, n, want)
		}
	}
}

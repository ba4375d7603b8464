package module

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

func TestReloadWhileRequestsFlowLosesNothing(t *testing.T) {
	g := startGateway(t, modelserver.Config{Latency: 20 * time.Millisecond}, "")
	before := g.post(chatPath, "before-reload", chat("before"))
	if before.StatusCode != 200 {
		t.Fatalf("before: %d", before.StatusCode)
	}

	var sent, failed, resets atomic.Int64
	var failures sync.Map
	load := testkit.StartKeyedLoad(8, 100_000, "flow", func(key string) bool {
		r := g.post(chatPath, key, chat(key))
		// Caddy binds each config's listener with SO_REUSEPORT; closing the old one can reset a
		// connection still in its accept backlog. A client retries with the same key, which is
		// exactly what Mulligan makes safe.
		for retry := 0; r.err != nil && retry < 3; retry++ {
			resets.Add(1)
			r = g.post(chatPath, key, chat(key))
		}
		sent.Add(1)
		switch {
		case r.err != nil:
			failed.Add(1)
			failures.Store(key, r.err.Error())
		case r.StatusCode != 200:
			failed.Add(1)
			failures.Store(key, fmt.Sprintf("%s %s", r.Status, r.body))
		}
		return true
	})
	for i := range 5 {
		time.Sleep(50 * time.Millisecond)
		g.reload(fmt.Sprintf("idempotency {\n ttl %dh\n}", 24+i))
	}
	time.Sleep(50 * time.Millisecond)
	load.Stop()

	failures.Range(func(k, v any) bool { t.Errorf("%s: %s", k, v); return true })
	t.Logf("%d keyed requests across 5 reloads: %d failed, %d connection resets retried with the same key", sent.Load(), failed.Load(), resets.Load())
	if failed.Load() != 0 {
		t.Fatal("requests failed during reloads")
	}
	for key, runs := range g.model.Stats().ByKey {
		if runs != 1 {
			t.Errorf("%s ran upstream %d times", key, runs)
		}
	}
	after := g.post(chatPath, "before-reload", chat("before"))
	if after.Header.Get(headerReplayed) != "true" || string(after.body) != string(before.body) {
		t.Fatalf("a key recorded before the reloads did not replay: %d %s", after.StatusCode, after.body)
	}
	// Every key answered during the reloads replays too: none was left claimed.
	for _, key := range []string{"flow-0-0", "flow-7-1"} {
		if r := g.post(chatPath, key, chat(key)); r.Header.Get(headerReplayed) != "true" {
			t.Errorf("%s: %d replayed=%q", key, r.StatusCode, r.Header.Get(headerReplayed))
		}
	}
}

package module

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
)

// storm sends n identical keyed requests at once per key and tallies the answers.
func storm(g *gateway, keys, perKey int) map[string]int {
	var mu sync.Mutex
	tally := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for k := range keys {
		for range perKey {
			wg.Go(func() {
				<-start
				key := fmt.Sprintf("storm-%d", k)
				r := g.post(chatPath, key, chat(key))
				outcome := "error"
				switch {
				case r.err != nil:
				case r.StatusCode == 200 && r.Header.Get(headerReplayed) == "true":
					outcome = "replayed"
				case r.StatusCode == 200:
					outcome = "first"
				case r.StatusCode == 409 && r.errorCode() == string(apierr.CodeInProgress):
					outcome = "in-progress"
				default:
					outcome = fmt.Sprintf("status %d %s", r.StatusCode, r.body)
				}
				mu.Lock()
				tally[outcome]++
				mu.Unlock()
			})
		}
	}
	close(start)
	wg.Wait()
	return tally
}

func TestConcurrentIdenticalRequestsRunUpstreamOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		keys, perKey int
		block        string
		allowed      []string
	}{
		{"200 at once, 409 for the rest", 1, 200, "", []string{"first", "replayed", "in-progress"}},
		{"200 at once with wait_inflight, all get the answer", 1, 200, "idempotency {\n wait_inflight 10s\n}", []string{"first", "replayed"}},
		{"20 keys x 50 at once", 20, 50, "", []string{"first", "replayed", "in-progress"}},
		{"20 keys x 50 at once with wait_inflight", 20, 50, "idempotency {\n wait_inflight 10s\n}", []string{"first", "replayed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startHandler(t, modelserver.Config{Latency: 300 * time.Millisecond}, tc.block)
			tally := storm(g, tc.keys, tc.perKey)
			stats := g.model.Stats()
			t.Logf("answers %v; upstream executions %d", tally, stats.Received)
			if stats.Received != int64(tc.keys) {
				t.Fatalf("upstream ran %d times for %d keys", stats.Received, tc.keys)
			}
			for k := range tc.keys {
				if n := stats.ByKey[fmt.Sprintf("storm-%d", k)]; n != 1 {
					t.Fatalf("key storm-%d ran %d times", k, n)
				}
			}
			total := 0
			for _, outcome := range tc.allowed {
				total += tally[outcome]
			}
			if total != tc.keys*tc.perKey || tally["first"] != tc.keys {
				t.Fatalf("unexpected answers: %v", tally)
			}
		})
	}
}

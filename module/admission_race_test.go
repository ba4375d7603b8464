package module

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
)

// Many concurrent submits of one scope never pass max_per_scope: the count and the write are
// one step per scope in the storage, and the calls this replica is accepting at that moment
// count too.
func TestConcurrentSubmitsNeverPassMaxPerScope(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{Latency: 20 * time.Second}, "async {\n max_per_scope 3\n concurrency 1\n}")
	var wg sync.WaitGroup
	statuses := make(chan int, 30)
	for i := range 30 {
		wg.Go(func() {
			key := fmt.Sprintf("k%d", i)
			r := g.post(chatPath, key, chat("async "+key), "Prefer", "respond-async", "Authorization", "Bearer alice")
			if r.StatusCode == http.StatusTooManyRequests {
				expectError(t, r, 429, apierr.CodeRateLimited, true)
			}
			statuses <- r.StatusCode
		})
	}
	wg.Wait()
	close(statuses)
	counts := map[int]int{}
	for s := range statuses {
		counts[s]++
	}
	if counts[http.StatusAccepted] != 3 || counts[http.StatusTooManyRequests] != 27 {
		t.Fatalf("30 concurrent submits with max_per_scope 3: %v", counts)
	}
}

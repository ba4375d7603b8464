package module

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// TestBatchLinesLeaveTheAsyncQueueLimitAndReadinessAlone: a batch's lines waiting for seats are
// not the `queue` an async call is refused against, nor what makes a replica not ready.
func TestBatchLinesLeaveTheAsyncQueueLimitAndReadinessAlone(t *testing.T) {
	up := newBatchUpstream()
	up.block = make(chan struct{})
	defer close(up.block)
	// takeover 1s: the queue is recounted from the storage every 250ms, as other replicas need.
	block := batchesBlock + "async {\n queue 10\n concurrency 1\n takeover 1s\n}\n"
	g := startGatewayWith(t, gatewaySetup{wrap: up.wrap, mulligan: block})
	alice := []string{"Authorization", "Bearer alice"}
	b := g.createBatch(t, batchInput(30, func(i int) string { return fmt.Sprint("slow ", i) }), "24h", alice...)
	testkit.WaitFor(t, 5*time.Second, `up.count("slow 1") == 1`, func() bool { return up.count("slow 1") == 1 }) // every line created, 29 waiting
	g.submit(t, "bob-1", "Authorization", "Bearer bob")                                                          // waits: the one seat is line 1's
	// The recount sees bob's call alone (before, the 29 lines as well, past the queue of 10).
	testkit.WaitFor(t, 5*time.Second, "the queued count recounted to bob's call alone", func() bool {
		var stats struct{ Queued int }
		return json.Unmarshal([]byte(g.adminCall("GET", "/mulligan/stats")), &stats) == nil && stats.Queued == 1
	})
	if r := g.get(pathReady); r.StatusCode != http.StatusOK {
		t.Fatalf("ready with batch %s waiting: %d %s", b.ID, r.StatusCode, r.body)
	}
	g.submit(t, "bob-2", "Authorization", "Bearer bob")
	if got := decodeBatch(t, g.get("/v1/batches/"+b.ID, alice...)); got.Status != "in_progress" {
		t.Fatalf("batch %s, want in_progress", got.Status)
	}
}

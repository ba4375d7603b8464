package module

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store/postgres"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// TestQueueDepthIsTheStoragesOnEveryReplica: another replica on the same PostgreSQL claims a
// queued operation this one accepted; mulligan_queue_depth (storage-wide, docs/operating.md)
// must show the database's queue at once, not this process's own tally.
func TestQueueDepthIsTheStoragesOnEveryReplica(t *testing.T) {
	dsn := pgtest.Database(t)
	started := make(chan struct{}, 4)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		started <- struct{}{}
		<-r.Context().Done()
	})
	g := startGatewayBefore(t, upstream, quietGlobals, "storage postgres "+dsn+"\nasync {\n concurrency 1\n}")
	for range 3 {
		g.submit(t, "")
	}
	<-started // one runs here, two wait
	other, err := postgres.Open(context.Background(), postgres.Options{DSN: dsn, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if op, err := other.ClaimNext("another-replica", time.Minute); err != nil || op == nil {
		t.Fatalf("the other replica's claim: %v %v", op, err)
	}
	queued, _, err := other.QueueStats()
	if err != nil {
		t.Fatal(err)
	}
	name := `mulligan_queue_depth{storage="` + postgres.DisplayName(dsn) + `"}`
	if got := g.scrape(t)[name]; got != float64(queued) {
		t.Fatalf("%s = %v while the storage holds %d queued", name, got, queued)
	}
}

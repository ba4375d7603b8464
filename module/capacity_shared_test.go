package module

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// countedSeats is a real PostgreSQL store's shared seats, counting the calls that take one.
type countedSeats struct {
	store.SharedSeats
	takes atomic.Int64
}

func (c *countedSeats) AcquireSeat(pool, seat, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	c.takes.Add(1)
	return c.SharedSeats.AcquireSeat(pool, seat, worker, limit, lease, w)
}

// closedSharedSeats is the shared seats of a PostgreSQL store whose pool is closed: every call
// fails as it does while the database is down.
func closedSharedSeats(t *testing.T) *countedSeats {
	t.Helper()
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: pgtest.Database(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return &countedSeats{SharedSeats: st}
}

// gatewayPool is the seat pool of g's capacity block.
func gatewayPool(t *testing.T, g *gateway) *seatPool {
	t.Helper()
	var found *seatPool
	for _, p := range g.registry().seatPoolsAt("") {
		if strings.Contains(p.key, g.dir) {
			found = p
		}
	}
	if found == nil {
		t.Fatal("no seat pool for the gateway")
	}
	return found
}

// shareThrough makes p take shared seats from ss (nil: no shared seats), as a block with
// `shared 1` on PostgreSQL does.
func shareThrough(p *seatPool, ss store.SharedSeats) { shareThroughFor(p, ss, time.Minute) }

// shareThroughFor is shareThrough with shared seats held under lease.
func shareThroughFor(p *seatPool, ss store.SharedSeats, lease time.Duration) {
	if ss == nil {
		p.UseShared(nil, 0)
		return
	}
	p.UseShared(newSharedSeats(ss, "test", "w", 1, lease, zap.NewNop()), 1)
}

func TestCapacitySharedSeatStorageFailureAnswers503AndIsNotRecorded(t *testing.T) {
	t.Parallel()
	g, _ := startSlotted(t, 2, 0, "capacity {\n limit 2\n}")
	pool := gatewayPool(t, g)
	shareThrough(pool, closedSharedSeats(t))
	for range 2 { // the retry gets the same answer, not a recorded one
		expectError(t, g.post(chatPath, "k-down", chat("down")), http.StatusServiceUnavailable, apierr.CodeStorage, true)
	}
	if st := g.model.Stats(); st.Received != 0 {
		t.Fatalf("the model server received %d calls; none may pass without a shared seat", st.Received)
	}
	shareThrough(pool, nil)
	if r := g.post(chatPath, "k-down", chat("down")); r.err != nil || r.StatusCode != http.StatusOK || r.Header.Get("Idempotency-Replayed") != "" {
		t.Fatalf("the key after the storage came back: %v %d %s", r.err, r.StatusCode, r.body)
	}
}

func TestCapacitySharedSeatStorageFailureRequeuesTheOperationWithoutAnAttempt(t *testing.T) {
	t.Parallel()
	g, _ := startSlotted(t, 2, 0, "async {\n concurrency 1\n}\ncapacity {\n limit 2\n}")
	pool := gatewayPool(t, g)
	down := closedSharedSeats(t)
	shareThrough(pool, down)
	_, op := g.submit(t, "")
	// Retries 3 allow four attempts: a sixth look for a seat shows the failures spent none. The
	// runner claims it again at its next poll (pollEvery, a second) after each failure, so six
	// take about 5 s (4.8 s alone); CI's load once made it more than the 5 s this wait had.
	testkit.WaitFor(t, 30*time.Second, "down.takes.Load() >= 6", func() bool { return down.takes.Load() >= 6 })
	shareThrough(pool, nil)
	done := g.await(t, op.OperationID)
	// Each requeue is a claim (counted in attempts), but only one call reached the upstream.
	if st := g.model.Stats(); done.Status != "succeeded" || st.Received != 1 {
		t.Fatalf("after the storage came back: %s, %d calls upstream; want succeeded after 1", done.Status, st.Received)
	}
}

// proxiedSharedSeats is a PostgreSQL store reached through a loopback proxy the test can cut,
// as a network partition cuts a replica off its database.
func proxiedSharedSeats(t *testing.T) (*postgres.Store, *testkit.CutProxy, string) {
	t.Helper()
	dsn := pgtest.Database(t)
	cut, proxy := testkit.CutDSN(t, dsn)
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: cut})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st, proxy, dsn
}

// A replica cut off its database longer than its lease cannot renew its shared seat: another
// replica may take it, so the call holding it is cut before it lapses, and its client gets
// 503 STORAGE_UNAVAILABLE rather than a call the model server runs beyond N.
func TestCapacitySharedSeatThatCannotBeRenewedCutsItsCall(t *testing.T) {
	// Not parallel: its 10 s for the call to reach the model server failed once eight-wide in CI.
	g, _ := startSlotted(t, 2, 0, "capacity {\n limit 2\n}")
	pool := gatewayPool(t, g)
	st, proxy, _ := proxiedSharedSeats(t)
	shareThroughFor(pool, st, time.Second)
	done := make(chan result, 1)
	go func() { done <- g.post(chatPath, "", chat("long"), modelserver.HeaderMockLatency, "20s") }()
	testkit.WaitFor(t, 10*time.Second, "the call on the model server", func() bool { return g.model.Stats().InFlight == 1 })
	proxy.Cut()
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the call went on with its shared seat unrenewable for 15s (lease 1s)")
	}
	expectError(t, r, http.StatusServiceUnavailable, apierr.CodeStorage, true)
	testkit.WaitFor(t, 5*time.Second, "the model server sees the call abandoned", func() bool { return g.model.Stats().Abandoned == 1 })
}

// A reload that opens the storage anew (durability changed: a second handle works beside the
// first until the old config lets go) keeps the shared seats working: the pool's seats, which
// outlive the reload, move to the open handle as the old one closes. They stayed on the closed
// handle, and every call after the reload got 503 STORAGE_UNAVAILABLE until a restart. A call
// holding a seat across the reload keeps it renewed and ends as it would have.
func TestCapacitySharedSeatsSurviveAReloadThatReopensTheStorage(t *testing.T) {
	dsn := pgtest.Database(t)
	body := "storage postgres " + dsn + "\ncapacity {\n limit 2\n shared 2\n}"
	g := startGatewayWith(t, gatewaySetup{model: modelserver.Config{}, globals: quietGlobals, mulligan: body})
	if r := g.post(chatPath, "", chat("before")); r.StatusCode != http.StatusOK {
		t.Fatalf("before the reload: %d %s", r.StatusCode, r.body)
	}
	across := make(chan result, 1)
	go func() { across <- g.post(chatPath, "", chat("across"), "X-Mock-Latency", "2s") }()
	testkit.WaitFor(t, 15*time.Second, "the call across the reload at the model server", func() bool { return g.model.Stats().InFlight == 1 })
	g.reload("durability relaxed\n" + body)
	testkit.WaitFor(t, 15*time.Second, "the old handle closed", func() bool {
		_, open := caddyRegistry.storagesAt("postgres " + dsn)
		return len(open) == 1
	})
	for i := range 3 {
		if r := g.post(chatPath, "", chat(fmt.Sprint("after ", i))); r.StatusCode != http.StatusOK {
			t.Fatalf("call %d after the reload: %d %s", i, r.StatusCode, r.body)
		}
	}
	if r := testkit.Receive(t, across, "the call across the reload"); r.StatusCode != http.StatusOK {
		t.Fatalf("the call holding a seat across the reload: %d %s", r.StatusCode, r.body)
	}
}

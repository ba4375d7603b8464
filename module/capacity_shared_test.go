package module

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

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

func (c *countedSeats) AcquireSeat(pool, seat, worker string, limit int, until time.Time) (bool, error) {
	c.takes.Add(1)
	return c.SharedSeats.AcquireSeat(pool, seat, worker, limit, until)
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
	seatPools.Range(func(k, v any) bool {
		if strings.Contains(k.(string), g.dir) {
			found = v.(*seatPool)
		}
		return true
	})
	if found == nil {
		t.Fatal("no seat pool for the gateway")
	}
	return found
}

// shareThrough makes p take shared seats from ss (nil: no shared seats), as a block with
// `shared 1` on PostgreSQL does.
func shareThrough(p *seatPool, ss store.SharedSeats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.Shared, p.shared = 0, nil
	if ss != nil {
		p.cfg.Shared = 1
		p.shared = &sharedSeats{st: ss, name: "test", worker: "w", lease: time.Minute, log: zap.NewNop(), stop: p.stopped}
		p.shared.limit.Store(1)
	}
}

func TestCapacitySharedSeatStorageFailureAnswers503AndIsNotRecorded(t *testing.T) {
	g, _ := startSlotted(t, 2, 0, "capacity {\n limit 2\n}")
	pool := gatewayPool(t, g)
	shareThrough(pool, closedSharedSeats(t))
	for range 2 { // the retry gets the same answer, not a recorded one
		expectError(t, g.post(chatPath, "k-down", chat("down")), http.StatusServiceUnavailable, CodeStorage, true)
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
	g, _ := startSlotted(t, 2, 0, "async {\n concurrency 1\n}\ncapacity {\n limit 2\n}")
	pool := gatewayPool(t, g)
	down := closedSharedSeats(t)
	shareThrough(pool, down)
	_, op := g.submit(t, "")
	// Retries 3 allow four attempts: a sixth look for a seat shows the failures spent none.
	testkit.WaitFor(t, 5*time.Second, "down.takes.Load() >= 6", func() bool { return down.takes.Load() >= 6 })
	shareThrough(pool, nil)
	done := g.await(t, op.OperationID)
	// Each requeue is a claim (counted in attempts), but only one call reached the upstream.
	if st := g.model.Stats(); done.Status != "succeeded" || st.Received != 1 {
		t.Fatalf("after the storage came back: %s, %d calls upstream; want succeeded after 1", done.Status, st.Received)
	}
}

func TestCapacitySeatTakenWithSharedIsReleasedAfterAReloadDropsShared(t *testing.T) {
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: pgtest.Database(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p := newSeatPool("test|/ops", "test", "test", "/ops", CapacityConfig{Limit: 1})
	defer p.Destruct()
	shareThrough(p, st)
	s, err := p.acquire(context.Background(), seatAsk{scope: "a", since: time.Now()}, time.Second)
	if err != nil || s.shared == "" {
		t.Fatalf("taking a seat with a shared one: %v %q", err, s.shared)
	}
	shareThrough(p, nil) // a reload without `shared`
	s.release(false)
	if snap := p.snapshot(); snap.InUse != 0 {
		t.Fatalf("%d local seats in use after the release; want 0", snap.InUse)
	}
	// The shared seat went back too: with shared 1, another holder takes it.
	if ok, err := st.AcquireSeat("test", "other", "w2", 1, time.Now().Add(time.Minute)); err != nil || !ok {
		t.Fatalf("the shared seat after the release: %v %v; want it free", ok, err)
	}
}

package module

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capacity"
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
func shareThrough(p *seatPool, ss store.SharedSeats) { shareThroughFor(p, ss, time.Minute) }

// shareThroughFor is shareThrough with shared seats held under lease.
func shareThroughFor(p *seatPool, ss store.SharedSeats, lease time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.Shared, p.shared = 0, nil
	if ss != nil {
		p.cfg.Shared = 1
		p.shared = newSharedSeats(ss, "test", "w", 1, lease, zap.NewNop())
	}
}

func TestCapacitySharedSeatStorageFailureAnswers503AndIsNotRecorded(t *testing.T) {
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
	s, err := p.acquire(context.Background(), seatAsk{Scope: "a", Since: time.Now()}, time.Second)
	if err != nil || s.shared == nil {
		t.Fatalf("taking a seat with a shared one: %v %v", err, s.shared)
	}
	shareThrough(p, nil) // a reload without `shared`
	s.release(capacity.Sample{})
	if snap := p.snapshot(); snap.InUse != 0 {
		t.Fatalf("%d local seats in use after the release; want 0", snap.InUse)
	}
	// The shared seat went back too: with shared 1, another holder takes it.
	if ok, err := st.AcquireSeat("test", "other", "w2", 1, time.Now().Add(time.Minute)); err != nil || !ok {
		t.Fatalf("the shared seat after the release: %v %v; want it free", ok, err)
	}
}

// proxiedSharedSeats is a PostgreSQL store reached through a loopback proxy the test can cut,
// as a network partition cuts a replica off its database.
func proxiedSharedSeats(t *testing.T) (*postgres.Store, *testkit.CutProxy, string) {
	t.Helper()
	dsn := pgtest.Database(t)
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Fatalf("the test cluster's DSN is not a URL: %q %v", dsn, err)
	}
	proxy := testkit.StartCutProxy(t, u.Host)
	u.Host = proxy.Addr()
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: u.String()})
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

// inFlightSeats is a real PostgreSQL store's shared seats, counting the looks for a seat and
// the most of them under way at once.
type inFlightSeats struct {
	store.SharedSeats
	takes, now, most atomic.Int64
}

func (c *inFlightSeats) AcquireSeat(pool, seat, worker string, limit int, until time.Time) (bool, error) {
	c.takes.Add(1)
	n := c.now.Add(1)
	defer c.now.Add(-1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	return c.SharedSeats.AcquireSeat(pool, seat, worker, limit, until)
}

// xactCommits reads the transactions committed in the database of dsn so far.
func xactCommits(t *testing.T, dsn string) int64 {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int64
	if err := conn.QueryRow(context.Background(), `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// 100 calls wait for the one shared seat another replica holds: the replica looks for a free
// seat for all of them with one transaction at a time, not one each every poll. Run with -v for
// the transactions per second the database served meanwhile (docs/capacity.md).
func TestCapacitySharedSeatWaitersLookForASeatOneAtATime(t *testing.T) {
	dsn := pgtest.Database(t)
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if ok, err := st.AcquireSeat("test", "other", "w2", 1, time.Now().Add(time.Minute)); err != nil || !ok {
		t.Fatalf("the other replica's seat: %v %v", ok, err)
	}
	seats := &inFlightSeats{SharedSeats: st}
	const waiters = 100
	p := newSeatPool("test|/ops", "test", "test", "/ops", CapacityConfig{Limit: waiters})
	defer p.Destruct()
	shareThrough(p, seats)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range waiters {
		wg.Go(func() {
			if _, err := p.acquire(ctx, seatAsk{Scope: "a", Since: time.Now()}, 0); err == nil {
				t.Error("a waiter got the seat the other replica holds")
			}
		})
	}
	testkit.WaitFor(t, 30*time.Second, "waiters looking", func() bool { return seats.takes.Load() >= waiters })
	began, commits, takes := time.Now(), xactCommits(t, dsn), seats.takes.Load()
	testkit.WaitFor(t, 60*time.Second, "200 more looks", func() bool { return seats.takes.Load() >= takes+200 })
	time.Sleep(time.Second) // pg_stat_database is flushed about once a second: measured, not asserted
	secs := time.Since(began).Seconds()
	t.Logf("%d waiters: %.0f looks/s, %.0f transactions/s committed in the database, at most %d looks at once",
		waiters, float64(seats.takes.Load()-takes)/secs, float64(xactCommits(t, dsn)-commits)/secs, seats.most.Load())
	cancel()
	wg.Wait()
	if m := seats.most.Load(); m != 1 {
		t.Fatalf("%d looks for a shared seat under way at once for %d waiters; want 1 (one look for all)", m, waiters)
	}
}

// A shared seat whose release failed (the database blipped) comes back to the other replicas:
// the release is retried, and the replica does not renew a seat none of its calls holds. With
// shared 1, another replica then takes the seat, rather than finding it "held, renewed" for as
// long as this replica lives.
func TestCapacitySharedSeatWhoseReleaseFailedComesBack(t *testing.T) {
	st, proxy, dsn := proxiedSharedSeats(t)
	other, err := postgres.Open(context.Background(), postgres.Options{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	p := newSeatPool("test|/ops", "test", "test", "/ops", CapacityConfig{Limit: 1})
	defer p.Destruct()
	shareThroughFor(p, st, time.Second)
	s, err := p.acquire(context.Background(), seatAsk{Scope: "a", Since: time.Now()}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	s.release(capacity.Sample{}) // fails: the database is out of reach
	proxy.Restore()
	if n := p.snapshot().InUse; n != 0 {
		t.Fatalf("%d local seats in use after the release; want 0", n)
	}
	testkit.WaitFor(t, 10*time.Second, "another replica takes the shared seat (lease 1s)", func() bool {
		ok, err := other.AcquireSeat("test", "b", "w2", 1, time.Now().Add(time.Minute))
		return ok && err == nil
	})
}

// waiters counts the calls waiting for a shared seat of s.
func (s *sharedSeats) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// The replica's one look for a shared seat serves its waiters in the order they came: each
// seat that comes free goes to the longest waiting.
func TestCapacitySharedSeatGoesToTheLocalWaitersInTheOrderTheyCame(t *testing.T) {
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: pgtest.Database(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if ok, err := st.AcquireSeat("test", "other", "w2", 1, time.Now().Add(time.Minute)); err != nil || !ok {
		t.Fatalf("the other replica's seat: %v %v", ok, err)
	}
	p := newSeatPool("test|/ops", "test", "test", "/ops", CapacityConfig{Limit: 3})
	defer p.Destruct()
	shareThrough(p, st)
	type got struct {
		i int
		s *seat
	}
	seats := make(chan got, 3)
	for i := range 3 {
		go func() {
			s, err := p.acquire(context.Background(), seatAsk{Scope: "a", Since: time.Now()}, 0)
			if err != nil {
				t.Error(err)
			}
			seats <- got{i, s}
		}()
		// Its first look found no seat: it gave its local seat back and waits in line.
		testkit.WaitFor(t, 10*time.Second, "the waiter in line", func() bool {
			return p.shared.waiters() == i+1 && p.snapshot().InUse == 0
		})
	}
	if err := st.ReleaseSeat("test", "other"); err != nil {
		t.Fatal(err)
	}
	for want := range 3 {
		g := <-seats
		if g.i != want {
			t.Fatalf("waiter %d got the freed seat before waiter %d", g.i, want)
		}
		g.s.release(capacity.Sample{})
	}
}

// A call waiting for a shared seat holds no local seat an urgent call of its replica needs; the
// seat that comes free goes to the most urgent waiter; and the shared seats are visible: limit,
// held by this replica and by the fleet, waiting by urgency.
func TestCapacitySharedSeatWaitersHoldNoLocalSeatAndTheMostUrgentGoesFirst(t *testing.T) {
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: pgtest.Database(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if ok, err := st.AcquireSeat("test", "other", "w2", 1, time.Now().Add(time.Minute)); err != nil || !ok {
		t.Fatalf("the other replica's seat: %v %v", ok, err)
	}
	p := newSeatPool("test|/ops", "test", "test", "/ops", CapacityConfig{Limit: 1})
	defer p.Destruct()
	shareThrough(p, st)
	type got struct {
		name string
		s    *seat
	}
	seats := make(chan got, 2)
	wait := func(name string, ask seatAsk, waiters int) {
		go func() {
			s, err := p.acquire(context.Background(), ask, 0)
			if err != nil {
				t.Error(err)
			}
			seats <- got{name, s}
		}()
		// Its first look found no seat: it gave its local seat back and waits in line.
		testkit.WaitFor(t, 10*time.Second, "the waiter in line without a local seat", func() bool {
			return p.shared.waiters() == waiters && p.snapshot().InUse == 0
		})
	}
	wait("batch", seatAsk{Urgency: 7, Scope: "a", Since: time.Now()}, 1)
	wait("urgent", seatAsk{Urgency: 0, Trusted: true, Scope: "b", Since: time.Now()}, 2)
	ss := p.sharedSnapshot()
	if ss == nil || ss.Limit != 1 || ss.Held != 0 || ss.Fleet == nil || *ss.Fleet != 1 || ss.Waiting[0] != 1 || ss.Waiting[7] != 1 {
		t.Fatalf("shared seats shown as %+v; want limit 1, none held here, 1 in the fleet, one waiter at u=0 and one at u=7", ss)
	}
	if err := st.ReleaseSeat("test", "other"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"urgent", "batch"} {
		g := <-seats
		if g.name != want {
			t.Fatalf("%s got the freed shared seat before %s", g.name, want)
		}
		g.s.release(capacity.Sample{})
	}
}

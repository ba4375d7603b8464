package postgres

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// statementCounter counts the statements sent to the server (BEGIN and COMMIT included), each
// one round trip, leaving out the notifiers' coalesced wake-ups and notices of freed seats,
// which run in the background.
type statementCounter struct {
	mu  sync.Mutex
	sql []string
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(data.SQL, "pg_notify('"+wakeChannel) && !strings.Contains(data.SQL, "pg_notify('"+seatsChannel) {
		c.mu.Lock()
		c.sql = append(c.sql, strings.Join(strings.Fields(data.SQL), " "))
		c.mu.Unlock()
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A batch (pgx's pipeline) is one round trip, whatever it holds: its statements count as one,
// joined by "; ".
type batchKey struct{}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.mu.Lock()
	c.sql = append(c.sql, "")
	at := len(c.sql) - 1
	c.mu.Unlock()
	return context.WithValue(ctx, batchKey{}, at)
}

func (c *statementCounter) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	at, ok := ctx.Value(batchKey{}).(int)
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok && at < len(c.sql) {
		c.sql[at] = strings.TrimPrefix(c.sql[at]+"; "+strings.Join(strings.Fields(data.SQL), " "), "; ")
	}
}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// during returns the statements fn sent.
func (c *statementCounter) during(fn func()) []string {
	c.mu.Lock()
	c.sql = nil
	c.mu.Unlock()
	fn()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sql
}

// TestRoundTripsPerRequest pins what each kind of request costs the database, in statements
// (each one round trip): a regression here is a regression of the gateway's throughput on
// PostgreSQL (docs/operating.md, "Performance").
func TestRoundTripsPerRequest(t *testing.T) {
	counter := &statementCounter{}
	st := openTest(t, pgtest.Database(t), Options{tracer: counter})
	testkit.WaitFor(t, 5*time.Second, "the replica listens", func() bool { return listening(st) })
	key, fp := []byte("key"), []byte("fp")
	resp := store.Response{Status: 200, Body: []byte(`{"ok":true}`)}
	req := &store.Request{Method: "POST", URL: "/v1/x", Body: []byte(`{}`)}
	fail := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	replay := func() {
		c, err := st.ClaimKey(key, fp, time.Minute)
		fail(err)
		if c.Outcome != store.Replay {
			t.Fatalf("outcome %v, want a replay", c.Outcome)
		}
	}
	accept := func(id string, want store.ClaimOutcome) func() {
		return func() {
			op := &store.Operation{ID: id, Scope: "s", Status: store.StatusQueued, Retention: time.Hour, SubmittedAt: time.Now()}
			ka := &store.KeyAccept{Key: []byte("k2"), Fingerprint: fp, Response: store.Response{Status: 202}, Expires: time.Now().Add(time.Hour)}
			c, err := st.AcceptOperation(op, req, ka)
			fail(err)
			if c.Outcome != want {
				t.Fatalf("outcome %v, want %v", c.Outcome, want)
			}
		}
	}
	cases := []struct {
		name string
		want int
		fn   func()
	}{
		{"new key: claim, then record", 2, func() {
			c, err := st.ClaimKey(key, fp, time.Minute)
			fail(err)
			fail(st.CompleteKey(key, c.Token, resp, time.Now().Add(time.Hour)))
		}},
		{"first replay on this replica", 1, replay},
		{"replay", 0, replay},
		{"async accept with a new key", 1, accept("op_1", store.Claimed)},
		{"async retry, first on this replica", 1, accept("op_2", store.Replay)},
		{"async retry", 0, accept("op_3", store.Replay)},
		{"async accept without a key", 1, func() {
			op := &store.Operation{ID: "op_4", Scope: "s", Status: store.StatusQueued, Retention: time.Hour, SubmittedAt: time.Now()}
			_, err := st.AcceptOperation(op, req, nil)
			fail(err)
		}},
		// Found, locked and its scope's turn taken in one statement, then its status written.
		{"claim of the next queued operation", 4, func() {
			op, err := st.ClaimNext("w", time.Minute)
			fail(err)
			if op == nil || op.ID != "op_1" {
				t.Fatalf("claimed %+v, want op_1", op)
			}
		}},
		// Locked and fenced, then its result, its request dropped and its row, in one round
		// trip (three before they were sent together).
		{"the outcome of a running operation", 4, func() {
			_, err := st.Transition("op_1", store.Change{To: store.StatusSucceeded, Holder: "w", Result: &resp})
			fail(err)
		}},
	}
	for _, tc := range cases {
		sql := counter.during(tc.fn)
		t.Logf("%s: %d statements", tc.name, len(sql))
		if len(sql) != tc.want {
			t.Errorf("%s: %d statements, want %d:\n%s", tc.name, len(sql), tc.want, strings.Join(sql, "\n"))
		}
	}
	// The retries wrote nothing: only op_1 and op_4 were accepted, and op_1, finished, no
	// longer keeps its request.
	for table, want := range map[string]int{"operations": 2, "operation_requests": 1} {
		if n := count(t, st, `SELECT count(*) FROM `+table); n != want {
			t.Errorf("%s: %d rows, want %d", table, n, want)
		}
	}
	// With an announcer, each change's event goes in the same pipeline as its writes: the claim
	// and the outcome keep their four round trips (the outcome took seven with an event when
	// each write was one).
	st.SetAnnouncer(func(op *store.Operation, _ *store.Response) *store.Event {
		return &store.Event{ID: "evt_" + op.ID + "_" + string(op.Status), OperationID: op.ID, Endpoint: "e", OccurredAt: time.Now()}
	})
	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"claim, with its event", func() {
			op, err := st.ClaimNext("w", time.Minute)
			fail(err)
			if op == nil || op.ID != "op_4" {
				t.Fatalf("claimed %+v, want op_4", op)
			}
		}},
		{"the outcome, with its event", func() {
			_, err := st.Transition("op_4", store.Change{To: store.StatusSucceeded, Holder: "w", Result: &resp})
			fail(err)
		}},
	} {
		if sql := counter.during(tc.fn); len(sql) != 4 {
			t.Errorf("%s: %d statements, want 4:\n%s", tc.name, len(sql), strings.Join(sql, "\n"))
		}
	}
	if n := count(t, st, `SELECT count(*) FROM events WHERE id LIKE 'evt_op_4_%'`); n != 2 {
		t.Errorf("%d events of op_4, want 2 (its claim's and its outcome's)", n)
	}
}

// Every claim waits for the WAL's flush, whatever on_crash says: the database can crash or
// fail over while the claiming replica runs on (store.ClaimMustBeDurable is Badger's).
func TestEveryClaimWaitsForTheFlush(t *testing.T) {
	counter := &statementCounter{}
	st := openTest(t, pgtest.Database(t), Options{tracer: counter})
	for _, onCrash := range []string{"", "requeue", "fail"} {
		op := &store.Operation{ID: "op_" + onCrash, Scope: "s", Status: store.StatusQueued, Retention: time.Hour, SubmittedAt: time.Now(),
			Exec: &store.Execution{OnCrash: onCrash}}
		if _, err := st.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil); err != nil {
			t.Fatal(err)
		}
		var claimed *store.Operation
		sql := counter.during(func() {
			var err error
			if claimed, err = st.ClaimNext("w", time.Minute); err != nil {
				t.Fatal(err)
			}
		})
		if claimed == nil || claimed.ID != op.ID {
			t.Fatalf("claimed %v, want %s", claimed, op.ID)
		}
		if all := strings.Join(sql, "\n"); strings.Contains(all, "synchronous_commit") {
			t.Errorf("on_crash %q: the claim's commit changes synchronous_commit:\n%s", onCrash, all)
		}
	}
}

// A look for a shared seat is one round trip whatever it finds (the pool's lock, the lapsed rows
// cleared and the decision sent together), and so is a seat handed over: the model server's slot
// is free while they run (docs/capacity.md, "Many replicas"). A look took five, and a seat freed
// while the replica's own calls waited a release, a notice and a look.
func TestASharedSeatLookIsOneRoundTrip(t *testing.T) {
	counter := &statementCounter{}
	st := openTest(t, pgtest.Database(t), Options{tracer: counter})
	testkit.WaitFor(t, 5*time.Second, "the replica listens", func() bool { return listening(st) })
	for _, step := range seatSteps(t, st) {
		if sql := counter.during(step.fn); len(sql) != 1 {
			t.Errorf("%s: %d round trips, want 1:\n%s", step.name, len(sql), strings.Join(sql, "\n"))
		}
	}
}

// The same looks through PgBouncer in transaction mode, where a look's batch runs as one
// transaction on whichever server connection is free (docs/backends.md, "Through PgBouncer").
func TestSharedSeatsThroughPgBouncer(t *testing.T) {
	bouncer := pgtest.StartBouncer(t, pgtest.Require(t), 2)
	direct := pgtest.Database(t)
	st := openTest(t, bouncer.DSN(t, direct), Options{DirectDSN: direct})
	for range 3 { // the statements described once, then from the cache
		for _, step := range seatSteps(t, st) {
			step.fn()
		}
	}
}

// seatStep is one step of seatSteps.
type seatStep struct {
	name string
	fn   func()
}

// seatSteps are looks and handovers of pool "p" of `shared 1` between workers a and b, each
// checking what it finds, that leave the pool as they found it: a takes the seat, b stands in
// line, a hands it over to b's call, which came first, b takes it and hands it over to its own
// next call, and gives it back.
func seatSteps(t *testing.T, st *Store) []seatStep {
	waiter := func(worker string) store.SeatWaiter {
		w := store.SeatWaiter{Urgency: 3, Key: "k"}
		if worker == "b" {
			w.Waited = time.Minute // b's calls came first: the seats a hands over are theirs
		}
		return w
	}
	look := func(seat, worker string, want bool) func() {
		return func() {
			if got, err := st.AcquireSeat("p", seat, worker, 1, time.Minute, waiter(worker)); err != nil || got != want {
				t.Fatalf("%s looking for %s: %v %v; want %v", worker, seat, got, err, want)
			}
		}
	}
	handOver := func(seat, next, worker string, want bool) func() {
		return func() {
			if got, err := st.HandOverSeat("p", seat, next, worker, 1, time.Minute, waiter(worker)); err != nil || got != want {
				t.Fatalf("%s handing %s over: %v %v; want %v", worker, seat, got, err, want)
			}
		}
	}
	return []seatStep{
		{"a look that takes the seat", look("s1", "a", true)},
		{"a look that stands in line", look("s2", "b", false)},
		{"a seat handed over to a better call of another replica", handOver("s1", "s3", "a", false)},
		{"a withdrawal from the line", func() {
			if err := st.WithdrawWaiter("p", "a"); err != nil {
				t.Fatal(err)
			}
		}},
		{"a look that takes the seat handed over", look("s2", "b", true)},
		{"a seat handed over to the replica's own call", handOver("s2", "s4", "b", true)},
		{"a seat released", func() {
			if err := st.ReleaseSeat("p", "s4"); err != nil {
				t.Fatal(err)
			}
		}},
	}
}

package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

func openTest(t testing.TB, dsn string, opts Options) *Store {
	t.Helper()
	opts.DSN = dsn
	if opts.SweepEvery == 0 {
		opts.SweepEvery = -1
	}
	st, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func count(t *testing.T, st *Store, sql string) int {
	t.Helper()
	var n int
	if err := st.pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The pool is sized by Options.MaxConns, else by the DSN's pool_max_conns, else 8: an
// operator's pool_max_conns was once overridden by the default.
func TestPoolSizeComesFromOptionsThenTheDSN(t *testing.T) {
	dsn := pgtest.Database(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	for _, c := range []struct {
		dsn  string
		opts int32
		want int32
	}{
		{dsn, 0, DefaultMaxConns},
		{dsn + sep + "pool_max_conns=3", 0, 3},
		{dsn + sep + "pool_max_conns=3", 5, 5},
	} {
		st := openTest(t, c.dsn, Options{MaxConns: c.opts})
		if got := st.pool.Config().MaxConns; got != c.want {
			t.Errorf("DSN %s, MaxConns %d: a pool of %d, want %d", DisplayName(c.dsn), c.opts, got, c.want)
		}
	}
}

func TestReplicasStartingTogetherMigrateOnce(t *testing.T) {
	dsn := pgtest.Database(t)
	var wg sync.WaitGroup
	stores := make([]*Store, 4)
	errs := make([]error, 4)
	for i := range stores {
		wg.Go(func() {
			stores[i], errs[i] = Open(context.Background(), Options{DSN: dsn, SweepEvery: -1})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	all, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, stores[0], `SELECT count(*) FROM schema_migrations`); n != len(all) {
		t.Fatalf("%d migrations recorded, want %d", n, len(all))
	}
	again := openTest(t, dsn, Options{})
	if err := again.Ping(); err != nil {
		t.Fatal(err)
	}
}

func TestSweepRemovesWhatIsPastRetentionOnOneReplicaAtATime(t *testing.T) {
	dsn := pgtest.Database(t)
	clock := storetest.NewClock()
	st := openTest(t, dsn, Options{Now: clock.Now, DeadLetterRetention: 48 * time.Hour})
	st.SetAnnouncer(func(op *store.Operation, _ *store.Response) *store.Event {
		if !op.Status.Final() {
			return nil
		}
		return &store.Event{ID: "evt_" + op.ID, OperationID: op.ID, Endpoint: "e", OccurredAt: clock.Now()}
	})
	c, err := st.ClaimKey([]byte("k"), []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CompleteKey([]byte("k"), c.Token, store.Response{Status: 200}, clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// A recorded stream, finished: its head and its 3 events go when their keep time ends.
	sc, err := st.ClaimKey([]byte("s"), []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_ = st.BeginStream([]byte("s"), store.KeyHolder(sc.Token), 200, nil, 2*time.Hour)
	_ = st.AppendEvents([]byte("s"), store.KeyHolder(sc.Token), []store.StreamEvent{{ID: "evt-1", Data: []byte("a")}, {ID: "2", Data: []byte("b")}, {ID: "3", Data: []byte("c")}})
	if err := st.FinishStream([]byte("s"), store.KeyHolder(sc.Token), clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"op_1", "op_2"} {
		op := &store.Operation{ID: id, Scope: "s", Status: store.StatusQueued, Retention: time.Hour, SubmittedAt: clock.Now()}
		if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Transition(id, store.Change{To: store.StatusCanceled, Result: &store.Response{Status: 499}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.MarkDelivered("evt_op_1", store.Attempt{Attempts: 1, At: clock.Now(), Status: 200}); err != nil {
		t.Fatal(err)
	}
	if err := st.DeadLetter("evt_op_2", "gave up", store.Attempt{Attempts: 1, At: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Sweep(); err != nil || got != (SweepStats{}) {
		t.Fatalf("a sweep before any retention removed %+v, %v", got, err)
	}

	// Another replica sweeping: this one skips its turn.
	other := openTest(t, dsn, Options{})
	conn, err := other.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, lockSweep); err != nil {
		t.Fatal(err)
	}
	clock.Advance(store.TombstoneFor + 2*time.Hour)
	if got, err := st.Sweep(); err != nil || !got.Skipped || got.Keys != 0 {
		t.Fatalf("with the lock held elsewhere: %+v, %v", got, err)
	}
	if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, lockSweep); err != nil {
		t.Fatal(err)
	}
	conn.Release()

	got, err := st.Sweep()
	want := SweepStats{Keys: 2, Results: 2, Operations: 2, Delivered: 1, DeadLetters: 1, StreamSegments: 1}
	if err != nil || got != want {
		t.Fatalf("swept %+v, %v; want %+v", got, err, want)
	}
	for table, sql := range map[string]string{
		"idempotency_keys": `SELECT count(*) FROM idempotency_keys`, "operations": `SELECT count(*) FROM operations`,
		"operation_results": `SELECT count(*) FROM operation_results`, "events": `SELECT count(*) FROM events`,
		"stream_heads": `SELECT count(*) FROM stream_heads`, "stream_segments": `SELECT count(*) FROM stream_segments`,
		"stream_ids": `SELECT count(*) FROM stream_ids`,
	} {
		if n := count(t, st, sql); n != 0 {
			t.Errorf("%s: %d rows left", table, n)
		}
	}
}

// receive waits for a wake-up, bounded.
func receive(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("no wake-up %s", what)
	}
}

func TestWakeupsCrossReplicasAndSurviveALostConnection(t *testing.T) {
	dsn := pgtest.Database(t)
	a, b := openTest(t, dsn, Options{}), openTest(t, dsn, Options{})
	receive(t, b.Wakeups(), "when the listener connected")
	op := &store.Operation{ID: "op_1", Scope: "s", Status: store.StatusQueued, Retention: time.Hour}
	if _, err := a.AcceptOperation(op, &store.Request{}, nil); err != nil {
		t.Fatal(err)
	}
	receive(t, b.Wakeups(), "for an operation queued on another replica")

	// The listener's connection dies: it reconnects by itself, and says so with a wake-up.
	pgtest.Admin(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = '`+pgtest.Name(t, dsn)+`' AND query LIKE 'LISTEN mulligan_%'`)
	receive(t, b.Wakeups(), "after reconnecting")
	if _, err := a.RequestCancel("op_1", time.Now()); err != nil {
		t.Fatal(err)
	}
	receive(t, b.Wakeups(), "for a cancel asked on another replica")
}

func TestDatabaseDownIsUnavailableAndRecovers(t *testing.T) {
	dsn := pgtest.Database(t)
	name := pgtest.Name(t, dsn)
	st := openTest(t, dsn, Options{Timeout: 2 * time.Second})
	c, err := st.ClaimKey([]byte("k"), []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CompleteKey([]byte("k"), c.Token, store.Response{Status: 200, Body: []byte("kept")}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}

	pgtest.Admin(t, `ALTER DATABASE `+name+` ALLOW_CONNECTIONS false`)
	pgtest.Admin(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '`+name+`'`)
	if err := st.Ping(); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("ping with the database down: %v, want ErrUnavailable", err)
	}
	if _, err := st.ClaimKey([]byte("k2"), []byte("fp"), time.Minute); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("claim with the database down: %v, want ErrUnavailable", err)
	}

	pgtest.Admin(t, `ALTER DATABASE `+name+` ALLOW_CONNECTIONS true`)
	var pingErr error
	for range 5 { // a pooled connection may still be found dead once
		if pingErr = st.Ping(); pingErr == nil {
			break
		}
	}
	if pingErr != nil {
		t.Fatalf("the pool did not recover: %v", pingErr)
	}
	got, err := st.ClaimKey([]byte("k"), []byte("fp"), time.Minute)
	if err != nil || got.Outcome != store.Replay || string(got.Record.Response.Body) != "kept" {
		t.Fatalf("after recovery: %+v %v; want the recorded answer", got, err)
	}
}

// Only an engine without LISTEN leaves a replica polling for good; a LISTEN refused for a
// passing reason (a standby during a failover, the server shutting down) is retried.
func TestOnlyAnEngineWithoutListenStopsTheListener(t *testing.T) {
	for _, tc := range []struct {
		code    string
		refused bool
	}{
		{"0A000", true},  // feature_not_supported: CockroachDB, YugabyteDB, a transaction pooler
		{"42601", true},  // syntax_error: an engine that does not parse it
		{"25006", false}, // read_only_sql_transaction: "cannot execute LISTEN during recovery"
		{"57P01", false}, // admin_shutdown: the server restarting
		{"57P03", false}, // cannot_connect_now
		{"53300", false}, // too_many_connections
	} {
		err := fmt.Errorf("LISTEN: %w", &pgconn.PgError{Code: tc.code, Message: "m"})
		if got := listenUnsupported(err); got != tc.refused {
			t.Errorf("SQLSTATE %s: stops listening %v, want %v", tc.code, got, tc.refused)
		}
	}
}

// A page of one status reads about what it returns, whatever the scope's history: a tenant
// with many finished operations asking for its running ones does not scan them all.
func TestListOfOneStatusReadsWhatItReturns(t *testing.T) {
	dsn := pgtest.Database(t)
	st := openTest(t, dsn, Options{})
	ctx := context.Background()
	now := time.Now()
	if _, err := st.pool.Exec(ctx, `INSERT INTO operations (id, scope, status, holder, lease_until, expires_at, purge_at, doc)
		SELECT 'op_' || lpad(i::text, 8, '0'), 'big', CASE WHEN i = 1 THEN 'running' ELSE 'succeeded' END,
			CASE WHEN i = 1 THEN 'w1' END, CASE WHEN i = 1 THEN $1::timestamptz + interval '1 minute' END,
			CASE WHEN i > 1 THEN $1::timestamptz + interval '1 hour' END, CASE WHEN i > 1 THEN $1::timestamptz + interval '8 days' END,
			convert_to('{"id":"op_' || lpad(i::text, 8, '0') || '"}', 'UTF8')
		FROM generate_series(1, 30000) i`, now); err != nil {
		t.Fatal(err)
	}
	if _, err := st.pool.Exec(ctx, `ANALYZE operations`); err != nil {
		t.Fatal(err)
	}
	scope := "big"
	for _, status := range []store.Status{store.StatusRunning, store.StatusQueued} {
		sql, args := listQuery(&scope, status, "", 51, now)
		if plan, read := explainAnalyze(t, st, sql, args...); read > 100 {
			t.Errorf("a page of %s operations read %d others:\n%s", status, read, plan)
		}
	}
	ops, _, err := st.ListOperations("big", store.StatusRunning, "", 50)
	if err != nil || len(ops) != 1 || ops[0].ID != "op_00000001" {
		t.Fatalf("running: %v %v", ids(ops), err)
	}
}

// explainAnalyze runs sql under EXPLAIN ANALYZE and returns its plan, and the rows its filters
// read and left out.
func explainAnalyze(t *testing.T, st *Store, sql string, args ...any) (plan string, read int) {
	t.Helper()
	rows, err := st.pool.Query(context.Background(), `EXPLAIN (ANALYZE, FORMAT TEXT) `+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range lines {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "Rows Removed by Filter: %d", &n); err == nil {
			read += n
		}
	}
	return strings.Join(lines, "\n"), read
}

func ids(ops []*store.Operation) []string {
	out := []string{}
	for _, o := range ops {
		out = append(out, o.ID)
	}
	return out
}

// Counting the outbox (every /metrics scrape) reads the pending events and the dead letters,
// not the delivered events kept for a day beside them.
func TestCountingEventsSkipsTheDeliveredOnes(t *testing.T) {
	dsn := pgtest.Database(t)
	st := openTest(t, dsn, Options{})
	ctx := context.Background()
	if _, err := st.pool.Exec(ctx, `INSERT INTO events (id, state, endpoint, next_attempt, dead_at, purge_at, doc)
		SELECT 'evt_' || lpad(i::text, 8, '0'), CASE WHEN i <= 5 THEN 'pending' WHEN i <= 8 THEN 'dead' ELSE 'delivered' END, 'e',
			CASE WHEN i <= 5 THEN now() END, CASE WHEN i BETWEEN 6 AND 8 THEN now() END, CASE WHEN i > 8 THEN now() + interval '1 day' END, '\x7b7d'
		FROM generate_series(1, 30000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.pool.Exec(ctx, `VACUUM ANALYZE events`); err != nil {
		t.Fatal(err)
	}
	rows, err := st.pool.Query(ctx, `EXPLAIN (ANALYZE, FORMAT TEXT) `+countEventsSQL)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range plan {
		var n int
		if strings.Contains(line, "Seq Scan") || (fmtScan(line, "Rows Removed by Filter: %d", &n) && n > 100) {
			t.Fatalf("counting 8 events read the delivered ones:\n%s", strings.Join(plan, "\n"))
		}
	}
	if pending, dead, err := st.CountEvents(); err != nil || pending != 5 || dead != 3 {
		t.Fatalf("pending %d dead %d %v, want 5 and 3", pending, dead, err)
	}
}

func fmtScan(line, format string, n *int) bool {
	_, err := fmt.Sscanf(strings.TrimSpace(line), format, n)
	return err == nil
}

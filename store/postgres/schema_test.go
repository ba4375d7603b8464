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

	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// MaxSchema is this binary's last migration.
func TestMaxSchemaIsTheLastMigration(t *testing.T) {
	all, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if last := all[len(all)-1].version; last != MaxSchema {
		t.Fatalf("the last migration is %d, MaxSchema %d", last, MaxSchema)
	}
}

// A database a newer binary migrated is refused, with what to do, when its compat marker says
// this binary can no longer read it; one that stays readable is used as it is.
func TestDatabaseOfANewerIncompatibleSchemaIsRefused(t *testing.T) {
	dsn := pgtest.Database(t)
	first := openTest(t, dsn, Options{})
	ctx := context.Background()
	if _, err := first.pool.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, 'future.sql')`, MaxSchema+1); err != nil {
		t.Fatal(err)
	}
	if _, err := first.pool.Exec(ctx, `UPDATE schema_compat SET readable_by = $1`, MaxSchema); err != nil {
		t.Fatal(err)
	}
	openTest(t, dsn, Options{}) // newer, but still readable by this binary
	if _, err := first.pool.Exec(ctx, `UPDATE schema_compat SET readable_by = $1`, MaxSchema+1); err != nil {
		t.Fatal(err)
	}
	st, err := Open(ctx, Options{DSN: dsn, SweepEvery: -1})
	if err == nil {
		st.Close()
		t.Fatalf("a binary of schema %d opened a database readable only by schema %d and newer", MaxSchema, MaxSchema+1)
	}
	want := fmt.Sprintf("the database is at schema %d, readable only by binaries of schema %d or newer; this binary knows schema %d at most: deploy a newer release",
		MaxSchema+1, MaxSchema+1, MaxSchema)
	if !errors.Is(err, ErrSchemaOutOfRange) || !strings.Contains(err.Error(), want) {
		t.Fatalf("refusal: %v\nwant it to say: %s", err, want)
	}
}

// A replica starting while another holds the migration lock says in its log that it waits, and
// starts once the lock is released.
func TestReplicaWaitingForAnotherMigrationSaysSo(t *testing.T) {
	dsn := pgtest.Database(t)
	ctx := context.Background()
	holder := holdTheMigrationLock(t, ctx, dsn)
	opened := openWaitingForTheMigrationLock(t, ctx, dsn, 10*time.Second)
	unlockAndAwaitOpen(t, ctx, holder, opened, 10*time.Second)
}

// A migration marked no-transaction runs statement by statement outside a transaction, as
// CREATE INDEX CONCURRENTLY needs, and is recorded; the same file without the marker fails.
func TestNoTransactionMigrationBuildsAnIndexConcurrently(t *testing.T) {
	st := openTest(t, pgtest.Database(t), Options{})
	ctx := context.Background()
	conn, err := st.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	body := "-- a comment\nDROP INDEX CONCURRENTLY IF EXISTS probe_ix;\nCREATE INDEX CONCURRENTLY probe_ix\n    ON operations (status);\n"
	if err := applyMigration(ctx, conn, migration{version: 900, name: "0900_probe.sql", sql: body}); err == nil {
		t.Fatal("CREATE INDEX CONCURRENTLY ran inside a transaction")
	}
	if err := applyMigration(ctx, conn, migration{version: 900, name: "0900_probe.sql", sql: noTransaction + "\n" + body}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, st, `SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE c.relname = 'probe_ix' AND i.indisvalid`); n != 1 {
		t.Fatalf("%d valid probe_ix indexes", n)
	}
	if n := count(t, st, `SELECT count(*) FROM schema_migrations WHERE version = 900`); n != 1 {
		t.Fatal("the migration was not recorded")
	}
	if got := statements(body); len(got) != 2 || got[1] != "CREATE INDEX CONCURRENTLY probe_ix\n    ON operations (status);" {
		t.Fatalf("statements: %q", got)
	}
}

// holdTheMigrationLock takes the migration lock on a session of its own, as a replica migrating
// does, closed when t ends.
func holdTheMigrationLock(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	holder, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close(ctx) })
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockMigrate); err != nil {
		t.Fatal(err)
	}
	return holder
}

// openWaitingForTheMigrationLock opens a store on dsn while another session holds the migration
// lock, and waits until the store logs that it waits for it (the test fails if it returns first,
// or says nothing within bound); the store's Open error arrives on the channel returned once the
// lock is released.
func openWaitingForTheMigrationLock(t *testing.T, ctx context.Context, dsn string, bound time.Duration) <-chan error {
	t.Helper()
	log := &captureLog{said: make(chan string, 4)}
	opened := make(chan error, 1)
	go func() {
		st, err := Open(ctx, Options{DSN: dsn, SweepEvery: -1, Logger: log})
		if err == nil {
			st.Close()
		}
		opened <- err
	}()
	select {
	case line := <-log.said:
		if !strings.Contains(line, "waiting for another replica's schema migration") {
			t.Fatalf("logged %q", line)
		}
	case err := <-opened:
		t.Fatalf("Open returned while another session held the migration lock: %v", err)
	case <-time.After(bound):
		t.Fatal("no log line while waiting for the migration lock")
	}
	return opened
}

// unlockAndAwaitOpen releases the migration lock holder holds and waits, within bound, for the
// store opening beside it (openWaitingForTheMigrationLock) to open.
func unlockAndAwaitOpen(t *testing.T, ctx context.Context, holder *pgx.Conn, opened <-chan error, bound time.Duration) {
	t.Helper()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lockMigrate); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(bound):
		t.Fatal("the store did not open once the migration lock was released")
	}
}

// captureLog hands each warning to a channel.
type captureLog struct {
	mu   sync.Mutex
	said chan string
}

func (l *captureLog) Errorf(f string, a ...any)   { l.put(f, a) }
func (l *captureLog) Warningf(f string, a ...any) { l.put(f, a) }
func (l *captureLog) Infof(string, ...any)        {}
func (l *captureLog) Debugf(string, ...any)       {}

func (l *captureLog) put(f string, a []any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case l.said <- fmt.Sprintf(f, a...):
	default:
	}
}

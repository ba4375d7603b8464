package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// Through PgBouncer in transaction mode without a direct DSN, a database that lacks migrations
// is refused with what to do, before anything is written; once a direct DSN has migrated it,
// the pooled store opens and works, polling instead of listening.
func TestPooledStoreWithoutDirectDSNNeedsAMigratedDatabase(t *testing.T) {
	bouncer := pgtest.StartBouncer(t, pgtest.Require(t), 2)
	direct := pgtest.Database(t)
	pooled := bouncer.DSN(t, direct)

	_, err := Open(context.Background(), Options{DSN: pooled, SweepEvery: -1})
	if !errors.Is(err, ErrMigrationsNeedSession) || !strings.Contains(err.Error(), "0001_init.sql") ||
		!strings.Contains(err.Error(), "direct DSN") {
		t.Fatalf("an empty database through the pooler: %v", err)
	}
	if n := countOn(t, direct, `SELECT count(*) FROM pg_tables WHERE tablename = 'schema_migrations'`); n != 0 {
		t.Fatal("the refused start wrote to the database")
	}

	migrated := openTest(t, direct, Options{})
	if migrated.Pooled() {
		t.Fatal("a direct DSN was taken for a pooler's")
	}
	st := openTest(t, pooled, Options{})
	if !st.Pooled() {
		t.Fatal("PgBouncer's DSN was not recognised as a pooler's")
	}
	if n := count(t, st, `SELECT count(*) FROM schema_migrations`); n == 0 {
		t.Fatal("no migrations read through the pooler")
	}
	if st.replays.listening {
		t.Fatal("the replay cache trusts a listener that cannot exist through the pooler")
	}
}

// A direct DSN that does not parse is a configuration error naming the direct DSN, never
// showing it.
func TestBadDirectDSNIsAConfigurationError(t *testing.T) {
	_, err := Open(context.Background(), Options{DSN: "postgres://u@127.0.0.1:1/db", DirectDSN: "postgres://u:s3cret@host:notaport/db"})
	if err == nil || !strings.Contains(err.Error(), "direct DSN") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("a bad direct DSN: %v", err)
	}
}

// countOn counts on a connection of its own, without opening (and so migrating) a store.
func countOn(t *testing.T, dsn, sql string) int { return pgtest.Count(t, dsn, sql) }

// A pooled replica without a direct DSN that starts while another replica migrates waits for
// that migration (it sees the lock in pg_locks) instead of refusing the half-migrated database.
func TestPooledStoreWaitsForAnotherReplicasMigration(t *testing.T) {
	bouncer := pgtest.StartBouncer(t, pgtest.Require(t), 2)
	direct := pgtest.Database(t)
	ctx := context.Background()
	holder := holdTheMigrationLock(t, ctx, direct)
	opened := openWaitingForTheMigrationLock(t, ctx, bouncer.DSN(t, direct), 20*time.Second)
	if err := migrate(ctx, holder, nil); err != nil { // the holder's session holds the lock already
		t.Fatal(err)
	}
	unlockAndAwaitOpen(t, ctx, holder, opened, 20*time.Second)
}

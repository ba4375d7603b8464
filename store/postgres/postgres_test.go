package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

// open opens a handle on dsn with clock now, closed when t ends.
func open(t testing.TB, dsn string, now func() time.Time) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: dsn, Now: now, MaxConns: 4, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// migrated is a database at this release's schema, which the behaviour suite's cases copy
// rather than each migrating a fresh one.
var migrated = pgtest.NewTemplate(func(dsn string) error {
	st, err := postgres.Open(context.Background(), postgres.Options{DSN: dsn, SweepEvery: -1})
	if err != nil {
		return err
	}
	return st.Close()
})

func TestMain(m *testing.M) {
	code := m.Run()
	migrated.Drop()
	os.Exit(code)
}

func TestPostgresConformance(t *testing.T) {
	pgtest.Require(t)
	storetest.Run(t, func(t *testing.T) storetest.Storage {
		dsn := migrated.Database(t)
		return func(now func() time.Time) store.Backend { return open(t, dsn, now) }
	})
}

// TestPostgresConformanceThroughPgBouncer runs the whole behaviour suite with every store
// reaching the database through PgBouncer in transaction mode (docs/backends.md, "Through
// PgBouncer"), which keeps no session between transactions: on 4 server connections for any
// number of stores. The direct DSN migrates; every statement goes through the pooler.
func TestPostgresConformanceThroughPgBouncer(t *testing.T) {
	bouncer := pgtest.StartBouncer(t, pgtest.Require(t), 4)
	storetest.Run(t, func(t *testing.T) storetest.Storage {
		direct := migrated.Database(t)
		pooled := bouncer.DSN(t, direct)
		return func(now func() time.Time) store.Backend {
			st, err := postgres.Open(context.Background(), postgres.Options{DSN: pooled, DirectDSN: direct, Now: now, MaxConns: 4, SweepEvery: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			return st
		}
	})
}

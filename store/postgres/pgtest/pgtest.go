// Package pgtest gives tests a PostgreSQL database of their own, on the cluster named by
// MULLIGAN_TEST_POSTGRES (./test.sh starts a throw-away one: scripts/pg-test-cluster.sh).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names the environment variable holding the test cluster's DSN.
const EnvDSN = "MULLIGAN_TEST_POSTGRES"

// Database creates a fresh database for t on the test cluster, dropped when t ends, and returns
// its DSN. Without a cluster t is skipped, saying how to get one; under CI=true it fails instead.
func Database(t testing.TB) string {
	t.Helper()
	admin := Require(t)
	if _, err := pgx.ParseConfig(admin); err != nil {
		t.Fatalf("%s: %v", EnvDSN, err)
	}
	name := randomName("mulligan_test_")
	exec(t, admin, "CREATE DATABASE "+name)
	t.Cleanup(func() { exec(t, admin, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	return withDatabase(t, admin, name)
}

// withDatabase is dsn naming database name instead.
func withDatabase(t testing.TB, dsn, name string) string {
	out, err := namingDatabase(dsn, name)
	if err != nil {
		t.Fatalf("%s: %v", EnvDSN, err)
	}
	return out
}

func namingDatabase(dsn, name string) (string, error) {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " dbname=" + name, nil // keyword/value form: the last setting wins
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

// Require returns the test cluster's DSN. Without one t is skipped, saying how to get one; under
// CI=true it fails instead.
func Require(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(EnvDSN)
	if admin == "" {
		msg := EnvDSN + " is not set: run ./test.sh, which starts a throw-away PostgreSQL (apt-get install postgresql for its binaries), or point it at a cluster"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return admin
}

// Admin runs sql on the test cluster as its administrator (to take a database down, say).
func Admin(t testing.TB, sql string) {
	t.Helper()
	exec(t, os.Getenv(EnvDSN), sql)
}

// Name is the database a DSN from Database names.
func Name(t testing.TB, dsn string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

// Count runs a query of one integer (a count, say) on dsn on a connection of its own (without
// opening, and so migrating, a store) and returns it.
func Count(t testing.TB, dsn, sql string, args ...any) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func exec(t testing.TB, dsn, sql string) {
	t.Helper()
	if err := run(dsn, sql); err != nil {
		t.Fatal(err)
	}
}

// run runs sql on dsn in a connection of its own.
func run(dsn, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connecting to the test cluster: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %v", sql, err)
	}
	return nil
}

// A Template is a database prepared once per test process (migrated, say), which tests then
// copy instead of preparing a fresh database each (CREATE DATABASE ... TEMPLATE: a file copy,
// without the statements and commits that made it). Drop removes it when the process's tests
// are done (TestMain).
type Template struct {
	prepare func(dsn string) error
	once    sync.Once
	name    string
	err     error
}

// NewTemplate returns a template prepared by prepare on first use.
func NewTemplate(prepare func(dsn string) error) *Template { return &Template{prepare: prepare} }

// Database creates a database for t copied from the template, dropped when t ends, and returns
// its DSN. Without a cluster t is skipped, saying how to get one; under CI=true it fails instead.
func (tp *Template) Database(t testing.TB) string {
	t.Helper()
	admin := Require(t)
	tp.once.Do(func() {
		name := randomName("mulligan_tmpl_")
		dsn, err := namingDatabase(admin, name)
		if err == nil {
			err = run(admin, "CREATE DATABASE "+name)
		}
		if tp.err = err; err != nil {
			return
		}
		tp.name = name
		tp.err = tp.prepare(dsn)
	})
	if tp.err != nil {
		t.Fatalf("preparing the template database: %v", tp.err)
	}
	name := randomName("mulligan_test_")
	exec(t, admin, "CREATE DATABASE "+name+" TEMPLATE "+tp.name)
	t.Cleanup(func() { exec(t, admin, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	return withDatabase(t, admin, name)
}

// Drop drops the template, if it was made.
func (tp *Template) Drop() {
	if tp.name != "" {
		_ = run(os.Getenv(EnvDSN), "DROP DATABASE IF EXISTS "+tp.name+" WITH (FORCE)")
	}
}

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

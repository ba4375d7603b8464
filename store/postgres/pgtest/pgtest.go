// Package pgtest gives tests a PostgreSQL database of their own, on the cluster named by
// MULLIGAN_TEST_POSTGRES (./test.sh starts a throw-away one: scripts/pg-test-cluster.sh).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
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
	admin := os.Getenv(EnvDSN)
	if admin == "" {
		msg := EnvDSN + " is not set: run ./test.sh, which starts a throw-away PostgreSQL (apt-get install postgresql for its binaries), or point it at a cluster"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if _, err := pgx.ParseConfig(admin); err != nil {
		t.Fatalf("%s: %v", EnvDSN, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "mulligan_test_" + hex.EncodeToString(b[:])
	exec(t, admin, "CREATE DATABASE "+name)
	t.Cleanup(func() { exec(t, admin, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	return withDatabase(t, admin, name)
}

// withDatabase is dsn naming database name instead.
func withDatabase(t testing.TB, dsn, name string) string {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " dbname=" + name // keyword/value form: the last setting wins
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("%s: %v", EnvDSN, err)
	}
	u.Path = "/" + name
	return u.String()
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

func exec(t testing.TB, dsn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to the test cluster: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

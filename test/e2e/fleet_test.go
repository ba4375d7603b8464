package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// fleetDB is the database a replica set shares and how its replicas reach it: directly, or
// through PgBouncer in transaction mode (docs/backends.md, "Through PgBouncer"). The replicas
// tests run their bodies both ways.
type fleetDB struct {
	direct  string          // the database itself
	bouncer *pgtest.Bouncer // nil: every replica connects directly
	size    int             // the replicas a test starts
}

// Through the pooler: 6 replicas, each with a pool of 8 (48 client connections), on 10 server
// connections.
const (
	pooledReplicas = 6
	bouncerPool    = 10
)

// onEachPath runs body on 3 replicas connected directly, then on pooledReplicas through
// PgBouncer; under CI=true a missing pgbouncer fails the second, elsewhere it is skipped.
func onEachPath(t *testing.T, body func(t *testing.T, db fleetDB)) {
	t.Run("direct", func(t *testing.T) {
		body(t, fleetDB{direct: pgtest.Database(t), size: 3})
	})
	t.Run("pgbouncer", func(t *testing.T) {
		bouncer := pgtest.StartBouncer(t, pgtest.Require(t), bouncerPool)
		db := fleetDB{direct: pgtest.Database(t), bouncer: bouncer, size: pooledReplicas}
		peak := db.watchServerConnections(t)
		body(t, db)
		got := peak()
		t.Logf("%d replicas through PgBouncer (transaction mode, %d server connections): at most %d server connections seen, the direct listener of replica 0 included",
			db.size, bouncerPool, got)
		if got > bouncerPool+1 {
			t.Fatalf("%d server connections, more than the pooler's %d and one listener", got, bouncerPool)
		}
	})
}

// start starts db.size replicas. Through the pooler, replica 0 (started first) also names the
// direct DSN: it applies the migrations and listens for wake-ups; the others have only the
// pooler's DSN, so they poll for work, and the set is a mixed fleet.
func (db fleetDB) start(t *testing.T, upstream, mulliganBody string) []*replica {
	t.Helper()
	if db.bouncer == nil {
		return startReplicas(t, db.size, upstream, db.direct, mulliganBody)
	}
	pooled := db.bouncer.DSN(t, db.direct)
	var out []*replica
	for i := range db.size {
		direct := ""
		if i == 0 {
			direct = db.direct
		}
		r := newReplicaVia(t, upstream, pooled, direct, mulliganBody)
		r.start()
		if i == 0 { // listening is not ready: the schema is there once its storage is open
			testkit.WaitFor(t, 30*time.Second, "replica 0 ready (its migrations applied)", func() bool {
				resp, _, err := r.send("GET", "/mulligan/healthz", "", "")
				return err == nil && resp.StatusCode == 200
			})
		}
		out = append(out, r)
	}
	return out
}

// watchServerConnections samples the connections PostgreSQL serves to the database while the
// test runs, and returns the function that stops and reports the most seen at once.
func (db fleetDB) watchServerConnections(t *testing.T) func() int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db.direct)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	most := 0
	wg.Go(func() {
		defer conn.Close(context.Background())
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var n int
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n)
			cancel()
			if err == nil {
				most = max(most, n)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	var once sync.Once
	report := func() int {
		once.Do(func() { close(stop); wg.Wait() })
		return most
	}
	t.Cleanup(func() { report() })
	return report
}

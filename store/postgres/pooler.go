package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mulligan-gw/mulligan/store"
)

// A connection pooler in transaction mode (PgBouncer's pool_mode = transaction) hands each
// transaction to whichever server connection is free, so nothing of a session survives from
// one transaction to the next: no LISTEN, no session advisory lock, no prepared statement, no
// SET. Everything the store does between its transactions is therefore stateless; what needs
// a session (the migration lock, LISTEN) goes over the direct DSN when there is one
// (docs/backends.md, "Through PgBouncer").

// throughPooler reports whether cfg's connections reach the server through a pooler. A pooler
// answers the startup with a cancel key of its own, so the process id it announces is not the
// server process that runs the statements (pg_backend_pid()); connected directly they are the
// same. An engine without pg_backend_pid counts as direct.
func throughPooler(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	cfg = cfg.Copy()
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // nothing named left on a shared server connection
	cfg.Tracer = nil
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	var pid int64
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return false, nil
		}
		return false, err
	}
	return pid != int64(conn.PgConn().PID()), nil
}

// setsExecMode reports whether dsn chooses pgx's default_query_exec_mode itself (a pooler
// that keeps prepared statements per client, say): the operator's choice is kept.
func setsExecMode(dsn string) bool {
	c, err := pgconn.ParseConfig(dsn)
	return err == nil && c.RuntimeParams["default_query_exec_mode"] != ""
}

// pooledExecMode is how statements go through a pooler: their descriptions (parameter and
// result types) are cached in the client, and each is sent with its own parse to the unnamed
// statement, in one round trip. Named prepared statements would stay on the server connection
// that prepared them, where the next transaction may not run (or another client's of the same
// name already is: "prepared statement already exists"). docs/backends.md gives the cost.
const pooledExecMode = pgx.QueryExecModeCacheDescribe

// parseDirect parses the direct DSN; its errors never show the DSN itself.
func parseDirect(dsn string) (*pgx.ConnConfig, error) {
	if dsn == "" {
		return nil, nil
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: direct DSN: %w", withoutDSN(err))
	}
	return cfg, nil
}

// migrateOver applies the migrations on a connection of its own made with cfg (the direct DSN,
// or the storage's when it reaches the server directly).
func migrateOver(ctx context.Context, cfg *pgx.ConnConfig, log store.Logger) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return migrate(ctx, conn, log)
}

// Pooled reports whether the store's DSN goes through a connection pooler (its statements are
// then not prepared on the server, and without a direct DSN the replica polls).
func (s *Store) Pooled() bool { return s.pooled }

// CheckDSN reports whether dsn parses, without connecting and without showing it in the error:
// what a configuration can check when it loads.
func CheckDSN(dsn string) error {
	if _, err := pgx.ParseConfig(dsn); err != nil {
		return withoutDSN(err)
	}
	return nil
}

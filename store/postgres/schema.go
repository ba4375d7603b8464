package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mulligan-gw/mulligan/store"
)

// The schema range this binary works with (docs/backends.md, "Rolling upgrades"): it migrates
// a database from any version down to MinSchema forward to MaxSchema, and runs on a database
// newer than MaxSchema only while that database's compat marker (schema_compat.readable_by,
// written by the migrations) says the data stays readable by a binary of MaxSchema.
const (
	// MinSchema is the oldest database schema this binary can migrate forward (0: an empty
	// database; every migration is embedded).
	MinSchema = 0
	// MaxSchema is the newest schema this binary knows: its last migration.
	MaxSchema = 21
)

// ErrSchemaOutOfRange refuses a database whose schema this binary cannot work with.
var ErrSchemaOutOfRange = errors.New("postgres: database schema out of this binary's range")

// noTransaction marks a migration file whose statements run one by one outside a transaction
// (CREATE INDEX CONCURRENTLY cannot run in one). Each of its statements must be safe to run
// again: after a crash part-way the migration is run again from its start.
const noTransaction = "-- mulligan:no-transaction"

// lockPoll paces the look for the migration lock while another replica holds it.
const lockPoll = 250 * time.Millisecond

// schemaState is what the database says of its schema: the newest migration applied, and the
// oldest binary schema its data stays readable by (0: no marker, before schema 4).
type schemaState struct {
	version    int
	readableBy int
}

// checkRange refuses a database outside this binary's range, with what to do about it.
func (st schemaState) checkRange(maxKnown int) error {
	switch {
	case st.version > 0 && st.version < MinSchema:
		return fmt.Errorf("%w: the database is at schema %d, older than %d, the oldest this binary migrates from; "+
			"upgrade it with an older release first", ErrSchemaOutOfRange, st.version, MinSchema)
	case st.version > maxKnown && st.readableBy > maxKnown:
		return fmt.Errorf("%w: the database is at schema %d, readable only by binaries of schema %d or newer; "+
			"this binary knows schema %d at most: deploy a newer release", ErrSchemaOutOfRange, st.version, st.readableBy, maxKnown)
	}
	return nil
}

// readSchema reads the applied migrations and the compat marker.
func readSchema(ctx context.Context, conn querier) (schemaState, error) {
	var st schemaState
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&st.version); err != nil {
		return st, err
	}
	err := conn.QueryRow(ctx, `SELECT readable_by FROM schema_compat`).Scan(&st.readableBy)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01", errors.Is(err, pgx.ErrNoRows): // undefined_table: before schema 4
		if st.version > MaxSchema {
			st.readableBy = st.version // a newer database without a marker: assume the worst
		}
		return st, nil
	}
	return st, err
}

// lockMigrations takes the migration lock on conn, waiting while another replica holds it
// (saying so in the log) until ctx ends. It polls rather than blocking in pg_advisory_lock: a
// statement blocked there holds a snapshot, which a CREATE INDEX CONCURRENTLY of the replica
// that migrates would wait for in turn.
func lockMigrations(ctx context.Context, conn querier, log store.Logger) error {
	said := false
	for {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, lockMigrate).Scan(&got); err != nil {
			return err
		}
		if got {
			if said && log != nil {
				log.Infof("postgres: the other replica's schema migration is done")
			}
			return nil
		}
		if !said && log != nil {
			log.Warningf("postgres: waiting for another replica's schema migration (it holds the migration lock)")
		}
		said = true
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for another replica's schema migration: %w", context.Cause(ctx))
		case <-time.After(lockPoll):
		}
	}
}

// applyMigration runs m and records it: in one transaction, or statement by statement outside
// any when the file is marked noTransaction.
func applyMigration(ctx context.Context, conn session, m migration) error {
	record := func(db querier) error {
		_, err := db.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name)
		return err
	}
	if !strings.HasPrefix(m.sql, noTransaction) {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			return record(tx)
		})
	}
	for _, stmt := range statements(m.sql) {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return record(conn)
}

// statements splits a no-transaction migration into its statements: comment lines dropped,
// each statement ending with a semicolon at the end of a line.
func statements(sql string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(sql) {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

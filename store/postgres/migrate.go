package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mulligan-gw/mulligan/store"
)

// migrations are the schema's versions, NNNN_name.sql, applied in order, each once.
//
//go:embed migrations/*.sql
var migrations embed.FS

// Advisory lock keys: one for migrations (every replica waits its turn at start), one for the
// retention sweep (a replica that does not get it skips its turn).
const (
	lockMigrate int64 = 0x6d756c6c_00000001
	lockSweep   int64 = 0x6d756c6c_00000002
)

type migration struct {
	version int
	name    string
	sql     string
}

func loadMigrations() ([]migration, error) {
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, f := range files {
		base := strings.TrimPrefix(f, "migrations/")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s: name is not NNNN_name.sql", base)
		}
		b, err := migrations.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: base, sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i := 1; i < len(out); i++ {
		// Two files of one version would leave which one ran to the order of a directory listing.
		if out[i].version == out[i-1].version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", out[i-1].name, out[i].name, out[i].version)
		}
	}
	return out, nil
}

// session is a connection of its own to the server: what the migration lock needs, since a
// session advisory lock lives as long as the server connection that took it.
type session interface {
	querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// migrate applies the migrations the database lacks, one at a time, holding the migration lock
// on conn (a session of its own, never a pooler's) throughout. ctx bounds the wait for the lock;
// the migrations themselves run to their end whatever it takes (a long index build must not be
// cut off by a start-up timeout, or it could never finish). A database outside the binary's
// schema range is refused (schema.go).
func migrate(ctx context.Context, conn session, log store.Logger) error {
	all, err := loadMigrations()
	if err != nil {
		return err
	}
	if err := lockMigrations(ctx, conn, log); err != nil {
		return err
	}
	run := context.WithoutCancel(ctx)
	defer func() { // ending the session would release it too
		_, _ = conn.Exec(run, `SELECT pg_advisory_unlock($1)`, lockMigrate)
	}()
	if _, err := conn.Exec(run, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	st, err := readSchema(run, conn)
	if err != nil {
		return err
	}
	if err := st.checkRange(MaxSchema); err != nil {
		return err
	}
	applied, err := appliedVersions(run, conn)
	if err != nil {
		return err
	}
	for _, m := range all {
		if applied[m.version] {
			continue
		}
		if err := applyMigration(run, conn, m); err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
	}
	return nil
}

// appliedVersions reads the versions schema_migrations records.
func appliedVersions(ctx context.Context, db querier) (map[int]bool, error) {
	rows, err := db.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, err
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, err
	}
	applied := map[int]bool{}
	for _, v := range versions {
		applied[v] = true
	}
	return applied, nil
}

// ErrMigrationsNeedSession refuses to start through a connection pooler on a database that
// lacks migrations: the lock that keeps replicas from migrating at once is a session's, and a
// transaction pooler keeps no session (docs/backends.md, "Through PgBouncer").
var ErrMigrationsNeedSession = errors.New("postgres: the database lacks schema migrations, and the storage DSN goes through a connection pooler, where the migration lock cannot be held")

// checkMigrated is migrate's part that needs no session: through a pooler without a direct
// DSN, the database must already hold every migration this binary has (a replica with a
// direct DSN, or an earlier release, applied them), and be within the binary's range. While
// another replica holds the migration lock, it waits for it (until ctx ends), as migrate does.
func checkMigrated(ctx context.Context, db querier, log store.Logger) error {
	all, err := loadMigrations()
	if err != nil {
		return err
	}
	for said := false; ; said = true {
		missing, err := missingMigrations(ctx, db, all)
		if err != nil {
			return err
		}
		if len(missing) == 0 {
			if said && log != nil {
				log.Infof("postgres: the other replica's schema migration is done")
			}
			break
		}
		var held bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid = $1 AND objid = $2 AND objsubid = 1)`, lockMigrate>>32, lockMigrate&0xffffffff).Scan(&held); err != nil {
			return err
		}
		if !held {
			return fmt.Errorf("%w: %s missing; name a direct DSN beside the pooled one (docs/backends.md), or start one replica with it first",
				ErrMigrationsNeedSession, strings.Join(missing, ", "))
		}
		if !said && log != nil {
			log.Warningf("postgres: waiting for another replica's schema migration (it holds the migration lock)")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for another replica's schema migration: %w", context.Cause(ctx))
		case <-time.After(lockPoll):
		}
	}
	st, err := readSchema(ctx, db)
	if err != nil {
		return err
	}
	return st.checkRange(MaxSchema)
}

// missingMigrations names the migrations of all the database lacks.
func missingMigrations(ctx context.Context, db querier, all []migration) ([]string, error) {
	applied, err := appliedVersions(ctx, db)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: an empty database
		applied, err = map[int]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, m := range all {
		if !applied[m.version] {
			missing = append(missing, m.name)
		}
	}
	return missing, nil
}

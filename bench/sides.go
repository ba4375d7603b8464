package main

import (
	"context"
	"fmt"
	"net/url"

	"github.com/mulligan-gw/mulligan/store/postgres"
)

// The Mulligan sides a run measures beside plain Caddy: Badger always, PostgreSQL with
// -postgres, as -replicas processes on the one database when -replicas is above 1, and with
// -pooled one more on the same database through PgBouncer.

// startSides starts the Mulligan gateways of the run, Badger first.
func (h *harness) startSides(ctx context.Context) error {
	dir := h.badgerDir("badger")
	g, err := h.startGateway(ctx, "badger", func(int) string { return mulliganSite(h.upstream, dir, "") })
	if err != nil {
		return err
	}
	h.mulligans = append(h.mulligans, g)
	if h.cfg.Postgres == "" {
		return nil
	}
	pool := &gateway{name: "postgres"}
	if h.cfg.Replicas > 1 {
		pool.name = fmt.Sprintf("postgres×%d", h.cfg.Replicas)
	}
	h.mulligans = append(h.mulligans, pool) // so that close stops what started if one fails
	for i := range h.cfg.Replicas {
		name := fmt.Sprintf("postgres-%d", i+1)
		storage, err := h.postgresStorage(name)
		if err != nil {
			return err
		}
		r, err := h.startGateway(ctx, name, func(int) string { return mulliganSite(h.upstream, storage, "") })
		if err != nil {
			return err
		}
		pool.replicas = append(pool.replicas, r)
	}
	pool.base, pool.admin = pool.replicas[0].base, pool.replicas[0].admin
	if h.cfg.Pooled == "" {
		return nil
	}
	dsn, err := withApplicationName(h.cfg.Pooled, h.applicationName("pgbouncer"))
	if err != nil {
		return err
	}
	g, err = h.startGateway(ctx, "pgbouncer", func(int) string { return mulliganSite(h.upstream, "postgres "+dsn, "") })
	if err != nil {
		return err
	}
	h.mulligans = append(h.mulligans, g)
	return nil
}

// pick is the base URL request seq goes to: the gateway's own, or its replicas' in turn.
func (g *gateway) pick(seq int64) string {
	if len(g.replicas) == 0 {
		return g.base
	}
	return g.replicas[uint64(seq)%uint64(len(g.replicas))].base
}

// postgresStorage is the storage line of the PostgreSQL gateway named name: the -postgres
// DSN with an application_name naming the run and the gateway, so that pg_stat_activity
// tells the gateways' connections apart (connections.go).
func (h *harness) postgresStorage(name string) (string, error) {
	dsn, err := withApplicationName(h.cfg.Postgres, h.applicationName(name))
	if err != nil {
		return "", err
	}
	return "postgres " + dsn, nil
}

// applicationName is the application_name of the gateway named name in this run.
func (h *harness) applicationName(name string) string {
	return "mulligan-bench-" + h.runID + "-" + name
}

// withApplicationName sets application_name in a postgres:// URL DSN. A key=value DSN is
// refused: its spaces would need quoting in the Caddyfile, and a URL says the same.
func withApplicationName(dsn, name string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("must be a postgres:// URL, got a DSN of another form (naming %s)", postgres.DisplayName(dsn))
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

package module

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres"
)

// migrationWait bounds how long a replica starting waits for another's schema migration (it
// says so in its log meanwhile). Connecting is bounded by the storage's own timeout, and a
// migration this replica runs is not bounded at all: cut off, a long one could never finish.
const migrationWait = 5 * time.Minute

// openPostgres connects to the storage's PostgreSQL database and applies its migrations. The
// DSN never reaches a log or an error: a failure names the database as storageSpec.name
// shows it.
func openPostgres(set storageSpec, log *zap.Logger) (store.Backend, error) {
	ctx, cancel := context.WithTimeout(context.Background(), migrationWait)
	defer cancel()
	pg, err := postgres.Open(ctx, postgres.Options{DSN: set.location, DirectDSN: set.direct, Logger: storeLogger{log.Named("postgres").Sugar()}})
	if err != nil {
		return nil, fmt.Errorf("mulligan: opening PostgreSQL storage %s: %w", set.name(), err)
	}
	return pg, nil
}

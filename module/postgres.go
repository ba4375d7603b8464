package module

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres"
)

// openPostgres connects to the storage's PostgreSQL database and applies its migrations. The
// DSN never reaches a log or an error: a failure names the database as storageSettings.name
// shows it.
func openPostgres(set storageSettings, log *zap.Logger) (store.Backend, error) {
	ctx, cancel := context.WithTimeout(context.Background(), postgres.DefaultTimeout*2)
	defer cancel()
	pg, err := postgres.Open(ctx, postgres.Options{DSN: set.location, Logger: storeLogger{log.Named("postgres").Sugar()}})
	if err != nil {
		return nil, fmt.Errorf("mulligan: opening PostgreSQL storage %s: %w", set.name(), err)
	}
	return pg, nil
}

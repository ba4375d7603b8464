package postgres

import (
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// StaleQueued returns up to limit queued operations whose QueueDeadline is before now (see
// store.Queue).
func (s *Store) StaleQueued(now time.Time, limit int) ([]*store.Operation, error) {
	return nil, nil
}

// QueuePosition estimates how many queued operations will be claimed before id (see store.Queue).
func (s *Store) QueuePosition(id string) (int, error) {
	return 0, nil
}

// QueuedByUrgency counts queued operations by their stored urgency (see store.Queue).
func (s *Store) QueuedByUrgency() ([8]int, error) {
	return [8]int{}, nil
}

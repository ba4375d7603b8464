package badger

import (
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// StaleQueued returns up to limit queued operations whose QueueDeadline is before now (see Queue).
func (s *Store) StaleQueued(now time.Time, limit int) ([]*store.Operation, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	return nil, nil
}

// QueuePosition estimates how many queued operations will be claimed before id (see Queue).
func (s *Store) QueuePosition(id string) (int, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	return 0, nil
}

// QueuedByUrgency counts queued operations by their stored urgency (see Queue).
func (s *Store) QueuedByUrgency() ([8]int, error) {
	var out [8]int
	if err := s.usable(); err != nil {
		return out, err
	}
	return out, nil
}

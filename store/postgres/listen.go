package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// wakeChannel is the NOTIFY channel of work: an operation queued or requeued, a cancel asked.
const wakeChannel = "mulligan_work"

// Wakeups receives when another replica may have queued work or asked for a cancel. It is a
// hint: the listener reconnects by itself after a failure, and notifications sent meanwhile are
// lost (one wake-up is sent on reconnecting), so callers also poll.
func (s *Store) Wakeups() <-chan struct{} { return s.wake }

func (s *Store) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// listen holds a dedicated connection (outside the pool) listening on wakeChannel, reconnecting
// with backoff until Close.
func (s *Store) listen(cfg *pgx.ConnConfig) {
	defer s.bg.Done()
	backoff := 100 * time.Millisecond
	for s.base.Err() == nil {
		start := time.Now()
		err := s.listenOnce(cfg)
		if s.base.Err() != nil {
			return
		}
		s.logf("postgres: wake-up listener: %v; reconnecting", err)
		if time.Since(start) > time.Minute {
			backoff = 100 * time.Millisecond // it was up a while: this is a new outage
		}
		select {
		case <-s.base.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (s *Store) listenOnce(cfg *pgx.ConnConfig) error {
	ctx, cancel := context.WithTimeout(s.base, s.opts.Timeout)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(s.base, "LISTEN "+wakeChannel); err != nil {
		return err
	}
	s.signal() // anything sent while no one listened
	for {
		if _, err := conn.WaitForNotification(s.base); err != nil {
			return err
		}
		s.signal()
	}
}

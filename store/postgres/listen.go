package postgres

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// wakeChannel is the NOTIFY channel of work: an operation queued or requeued, a cancel asked.
const wakeChannel = "mulligan_work"

// Wakeups receives when another replica may have queued work or asked for a cancel. It is a
// hint: the listener reconnects by itself after a failure, and notifications sent meanwhile are
// lost (one wake-up is sent on reconnecting), so callers also poll.
func (s *Store) Wakeups() <-chan struct{} { return s.wake }

// notifyEvery spaces this replica's notifications. A transaction that notifies holds a lock
// that serialises every notifying commit in the cluster, fsync included, so notifications are
// sent after the commit, on their own, coalesced: one per interval however many operations
// were queued meanwhile.
const notifyEvery = 20 * time.Millisecond

// poke tells this replica at once, and the others through the notifier, that there may be work.
func (s *Store) poke() {
	s.signal()
	select {
	case s.notifyCh <- struct{}{}:
	default:
	}
}

// noticeCommit, in the FROM of a statement that only sends notices, has its transaction commit
// without waiting for the WAL's flush: a notice is a hint (its listeners look on their own
// anyway), and PostgreSQL gives a notifying transaction an id and a commit record, so it
// otherwise waited on the disk before the replicas heard of a seat or work freed. Listeners
// receive it once it commits, flushed or not.
const noticeCommit = `(SELECT set_config('synchronous_commit', 'off', true)) relaxed`

// notifier sends the coalesced notifications until Close.
func (s *Store) notifier() {
	defer s.bg.Done()
	for {
		select {
		case <-s.base.Done():
			return
		case <-s.notifyCh:
		}
		ctx, cancel := context.WithTimeout(s.base, s.opts.Timeout)
		if _, err := s.pool.Exec(ctx, `SELECT pg_notify('`+wakeChannel+`', '') FROM `+noticeCommit); err != nil && s.base.Err() == nil {
			s.logf("postgres: notifying the replicas: %v", err) // they poll meanwhile
		}
		cancel()
		select {
		case <-s.base.Done():
			return
		case <-time.After(notifyEvery):
		}
	}
}

func (s *Store) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// listen holds a dedicated connection (outside the pool) listening on wakeChannel, keysChannel
// and seatsChannel, reconnecting
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
		var refused listenRefused
		if errors.As(err, &refused) {
			// The server refused LISTEN itself (an engine without it): polling alone it is.
			s.logf("postgres: wake-ups unavailable, replicas will poll: %v", refused.err)
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
	ctx, cancel = context.WithTimeout(s.base, s.opts.Timeout) // a server that never answers is an outage too
	_, err = conn.Exec(ctx, "LISTEN "+keysChannel)
	if err == nil {
		_, err = conn.Exec(ctx, "LISTEN "+wakeChannel)
	}
	if err == nil {
		_, err = conn.Exec(ctx, "LISTEN "+seatsChannel)
	}
	cancel()
	if err != nil {
		if listenUnsupported(err) {
			return listenRefused{err}
		}
		return err
	}
	// Evictions told while no one listened are lost: the replay cache starts empty, and keeps
	// nothing once this connection is gone.
	s.replays.reset(true)
	defer s.replays.reset(false)
	s.signal() // anything sent while no one listened
	s.seats.heardAll()
	for {
		n, err := conn.WaitForNotification(s.base)
		if err != nil {
			return err
		}
		switch n.Channel {
		case keysChannel:
			s.replays.heard(n.Payload)
		case seatsChannel:
			s.seats.heardFreed(n.Payload)
		default:
			s.signal()
		}
	}
}

// listenRefused is the server's answer to LISTEN when it does not support it.
type listenRefused struct{ err error }

func (l listenRefused) Error() string { return l.err.Error() }

// listenUnsupported reports whether the server refused LISTEN because it has no such thing
// (feature_not_supported, or a syntax error from an engine that does not parse it). Any other
// refusal passes (a standby during a failover, the server shutting down) and is retried.
func listenUnsupported(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "0A") || pgErr.Code == "42601")
}

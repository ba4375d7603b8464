package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
)

// SetAnnouncer installs the function whose event is written with each status change, for this
// handle.
func (s *Store) SetAnnouncer(a store.Announcer) { s.announcer.Store(&a) }

// announce writes op's event, if any, in tx.
func (s *Store) announce(ctx context.Context, tx execer, op *store.Operation, result *store.Response) error {
	ev := store.PendingEvent(s.announcer.Load(), op, result)
	if ev == nil {
		return nil
	}
	return putEvent(ctx, tx, ev, s.now())
}

// eventColumns are read by scanEvent: the document, and the state and due time that
// RescheduleEndpoint updates without rewriting it.
const eventColumns = `doc, state, next_attempt`

func scanEvent(row pgx.Row) (*store.Event, error) {
	var doc []byte
	var state string
	var next *time.Time
	if err := row.Scan(&doc, &state, &next); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, domain{store.ErrNotFound}
		}
		return nil, err
	}
	var ev store.Event
	if err := json.Unmarshal(doc, &ev); err != nil {
		return nil, fmt.Errorf("event document: %w", err)
	}
	ev.State = store.EventState(state)
	if next != nil {
		ev.NextAttempt = *next
	}
	return &ev, nil
}

// putEvent inserts or rewrites ev; a delivered event is kept for store.DeliveredKeptFor, a dead
// letter until the dead-letter retention (counted from dead_at).
func putEvent(ctx context.Context, db execer, ev *store.Event, now time.Time) error {
	doc, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	var next, deadAt, purge *time.Time
	switch ev.State {
	case store.EventPending:
		next = &ev.NextAttempt
	case store.EventDelivered:
		p := now.Add(store.DeliveredKeptFor)
		purge = &p
	case store.EventDead:
		deadAt = &now
	}
	_, err = db.Exec(ctx, `INSERT INTO events (id, state, endpoint, next_attempt, dead_at, purge_at, doc)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (id) DO UPDATE SET state = $2, next_attempt = $4, dead_at = $5, purge_at = $6, doc = $7,
			holder = NULL, lease_until = NULL`,
		ev.ID, string(ev.State), ev.Endpoint, next, deadAt, purge, doc)
	return err
}

// DueEvents returns up to limit pending events due between from and now, soonest first.
func (s *Store) DueEvents(from, now time.Time, limit int) ([]store.Due, error) {
	if limit <= 0 {
		return nil, nil // PostgreSQL refuses a negative LIMIT
	}
	var out []store.Due
	err := s.query(func(ctx context.Context, db querier) error {
		rows, err := db.Query(ctx, `SELECT id, endpoint, next_attempt FROM events WHERE state = 'pending'
			AND next_attempt >= $1 AND next_attempt <= $2 ORDER BY next_attempt, id LIMIT $3`, from, now, limit)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Due, error) {
			var d store.Due
			return d, r.Scan(&d.ID, &d.Endpoint, &d.At)
		})
		return err
	})
	return out, err
}

// NextDue reports when the soonest pending event due at or after from is due (zero: none).
func (s *Store) NextDue(from time.Time) (time.Time, error) {
	var at *time.Time
	err := s.query(func(ctx context.Context, db querier) error {
		return db.QueryRow(ctx, `SELECT min(next_attempt) FROM events WHERE state = 'pending' AND next_attempt >= $1`, from).Scan(&at)
	})
	return deref(at), err
}

// ClaimEvent takes pending, due event id for delivery by worker until now+lease, unless another
// worker's claim on it is still running (see store.Outbox).
func (s *Store) ClaimEvent(id, worker string, lease time.Duration) (*store.Event, error) {
	if !storable(id) {
		return nil, store.ErrNotFound
	}
	var out *store.Event
	err := s.query(func(ctx context.Context, db querier) error {
		now := s.now()
		ev, err := scanEvent(db.QueryRow(ctx, `UPDATE events SET holder = $2, lease_until = $3
			WHERE id = $1 AND state = 'pending' AND next_attempt <= $4
				AND (holder IS NULL OR holder = $2 OR lease_until <= $4)
			RETURNING `+eventColumns, id, worker, now.Add(lease), now))
		if err == nil {
			out = ev
			return nil
		}
		if !isNotFound(err) {
			return err
		}
		var exists bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM events WHERE id = $1)`, id).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return domain{store.ErrNotFound}
		}
		return nil
	})
	return out, err
}

// MarkDelivered records an acknowledged delivery: the event is never sent again.
func (s *Store) MarkDelivered(id string, a store.Attempt) error {
	return s.settle(id, store.EventPending, func(ev *store.Event) { ev.Delivered(a) })
}

// Reschedule puts a pending event back in the schedule, due at next.
func (s *Store) Reschedule(id string, next time.Time, a store.Attempt) error {
	return s.settle(id, store.EventPending, func(ev *store.Event) { ev.Rescheduled(next, a) })
}

// DeadLetter moves a pending event to the dead letters.
func (s *Store) DeadLetter(id, reason string, a store.Attempt) error {
	return s.settle(id, store.EventPending, func(ev *store.Event) { ev.DeadLettered(reason, a) })
}

// Redeliver moves a dead letter back to pending, due at `at`, with a fresh budget and max_age.
func (s *Store) Redeliver(id string, at time.Time) (*store.Event, error) {
	var out *store.Event
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		var err error
		out, err = s.step(ctx, tx, id, store.EventDead, func(ev *store.Event) { ev.Redelivered(at) })
		return err
	})
	return out, err
}

// settle applies an outcome to a pending event and ends its delivery claim; an event no longer
// pending is left as it is.
func (s *Store) settle(id string, from store.EventState, fn func(ev *store.Event)) error {
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		_, err := s.step(ctx, tx, id, from, fn)
		return err
	})
}

// step applies fn to event id, locked, when it is in state from; it returns the event as it
// ends up.
func (s *Store) step(ctx context.Context, tx pgx.Tx, id string, from store.EventState, fn func(ev *store.Event)) (*store.Event, error) {
	if !storable(id) {
		return nil, domain{store.ErrNotFound}
	}
	ev, err := scanEvent(tx.QueryRow(ctx, `SELECT `+eventColumns+` FROM events WHERE id = $1 FOR UPDATE`, id))
	if err != nil {
		return nil, err
	}
	if ev.State != from {
		return ev, nil
	}
	fn(ev)
	return ev, putEvent(ctx, tx, ev, s.now())
}

// GetEvent returns event id, or store.ErrNotFound.
func (s *Store) GetEvent(id string) (*store.Event, error) {
	if !storable(id) {
		return nil, store.ErrNotFound
	}
	var out *store.Event
	err := s.query(func(ctx context.Context, db querier) error {
		var err error
		out, err = scanEvent(db.QueryRow(ctx, `SELECT `+eventColumns+` FROM events WHERE id = $1`, id))
		return err
	})
	return out, err
}

// DeadLetters returns up to limit dead letters, oldest id first, after `after`.
func (s *Store) DeadLetters(after string, limit int) ([]*store.Event, error) {
	if limit <= 0 {
		return nil, nil // PostgreSQL refuses a negative LIMIT
	}
	from := ""
	if after != "" {
		var ok bool
		if from, ok = above(after); !ok {
			return nil, nil // no id sorts above it
		}
	}
	var out []*store.Event
	err := s.query(func(ctx context.Context, db querier) error {
		rows, err := db.Query(ctx, `SELECT `+eventColumns+` FROM events WHERE state = 'dead' AND id >= $1 ORDER BY id LIMIT $2`, from, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			ev, err := scanEvent(rows)
			if err != nil {
				return err
			}
			out = append(out, ev)
		}
		return rows.Err()
	})
	return out, err
}

// countEventsSQL counts pending and dead events, each on its own partial index (events_due,
// events_dead): the delivered events kept beside them, by far the most, are not read.
const countEventsSQL = `SELECT (SELECT count(*) FROM events WHERE state = 'pending'),
	(SELECT count(*) FROM events WHERE state = 'dead')`

// CountEvents counts pending and dead-lettered events.
func (s *Store) CountEvents() (pending, dead int, err error) {
	err = s.query(func(ctx context.Context, db querier) error {
		return db.QueryRow(ctx, countEventsSQL).Scan(&pending, &dead)
	})
	return pending, dead, err
}

// SetEndpointState records an endpoint's lasting state.
func (s *Store) SetEndpointState(name string, st store.EndpointState) error {
	doc, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return s.query(func(ctx context.Context, db querier) error {
		_, err := db.Exec(ctx, `INSERT INTO endpoint_states (name, doc) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET doc = $2`, name, doc)
		return err
	})
}

// GetEndpointState returns an endpoint's state (the zero state when none was recorded).
func (s *Store) GetEndpointState(name string) (store.EndpointState, error) {
	var st store.EndpointState
	if !storable(name) {
		return st, nil
	}
	err := s.query(func(ctx context.Context, db querier) error {
		var doc []byte
		err := db.QueryRow(ctx, `SELECT doc FROM endpoint_states WHERE name = $1`, name).Scan(&doc)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		return json.Unmarshal(doc, &st)
	})
	return st, err
}

// RescheduleEndpoint makes every pending event of endpoint due at `at`; it returns how many.
func (s *Store) RescheduleEndpoint(endpoint string, at time.Time) (int, error) {
	if !storable(endpoint) {
		return 0, nil
	}
	var n int
	err := s.query(func(ctx context.Context, db querier) error {
		tag, err := db.Exec(ctx, `UPDATE events SET next_attempt = $2 WHERE state = 'pending' AND endpoint = $1`, endpoint, at)
		n = int(tag.RowsAffected())
		return err
	})
	return n, err
}

func isNotFound(err error) bool {
	var d domain
	return errors.As(err, &d) && errors.Is(d.error, store.ErrNotFound)
}

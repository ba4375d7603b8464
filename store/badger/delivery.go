package badger

import (
	"sync"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/mulligan-gw/mulligan/store"
)

// eventLeases are the Badger backend's delivery claims. One process owns a Badger directory, so
// they live in memory: a crash drops them with the process that held them.
type eventLeases struct {
	mu    sync.Mutex
	until map[string]eventLease
}

type eventLease struct {
	worker string
	until  time.Time
}

// take gives id to worker until `until` unless another worker holds an unexpired lease.
func (l *eventLeases) take(id, worker string, now, until time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.until == nil {
		l.until = map[string]eventLease{}
	}
	if cur, ok := l.until[id]; ok && cur.worker != worker && now.Before(cur.until) {
		return false
	}
	l.until[id] = eventLease{worker: worker, until: until}
	return true
}

func (l *eventLeases) drop(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.until, id)
}

// ClaimEvent takes pending, due event id for delivery by worker (see Outbox).
func (s *Store) ClaimEvent(id, worker string, lease time.Duration) (*store.Event, error) {
	now := s.now()
	// The claim comes before the read: a read taken before another worker's delivery commits,
	// then a claim taken once that worker let go, would hand out an acknowledged event again.
	if !s.sh.eventLeases.take(id, worker, now, now.Add(lease)) {
		return nil, nil
	}
	ev, err := s.GetEvent(id)
	if err != nil || ev.State != store.EventPending || ev.NextAttempt.After(now) {
		s.sh.eventLeases.drop(id)
		return nil, err
	}
	return ev, nil
}

// MarkDelivered records an acknowledged delivery (see Outbox).
func (s *Store) MarkDelivered(id string, a store.Attempt) error {
	return s.settleEvent(id, func(ev *store.Event) { ev.Delivered(a) })
}

// Reschedule puts a pending event back in the schedule, due at next (see Outbox).
func (s *Store) Reschedule(id string, next time.Time, a store.Attempt) error {
	return s.settleEvent(id, func(ev *store.Event) { ev.Rescheduled(next, a) })
}

// DeadLetter moves a pending event to the dead letters (see Outbox).
func (s *Store) DeadLetter(id, reason string, a store.Attempt) error {
	return s.settleEvent(id, func(ev *store.Event) { ev.DeadLettered(reason, a) })
}

// Redeliver moves a dead letter back to pending with a fresh budget and max_age (see Outbox).
func (s *Store) Redeliver(id string, at time.Time) (*store.Event, error) {
	var out *store.Event
	err := s.update(func(txn *badger.Txn) error {
		ev, err := getEvent(txn, id)
		if err != nil {
			return err
		}
		out = ev
		if ev.State != store.EventDead {
			return nil
		}
		prev := *ev
		ev.Redelivered(at)
		return s.sh.putEvent(txn, ev, &prev)
	})
	return out, err
}

// settleEvent applies an attempt's outcome to a pending event and ends its delivery claim. An
// event that is no longer pending (delivered or dead-lettered meanwhile) is left as it is.
func (s *Store) settleEvent(id string, fn func(ev *store.Event)) error {
	defer s.sh.eventLeases.drop(id)
	return s.update(func(txn *badger.Txn) error {
		ev, err := getEvent(txn, id)
		if err != nil {
			return err
		}
		if ev.State != store.EventPending {
			return nil
		}
		prev := *ev
		fn(ev)
		return s.sh.putEvent(txn, ev, &prev)
	})
}

// What each outbox step does to an event, for every backend. The backend applies them to pending
// events only (Redelivered to dead letters only).

package badger

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/mulligan-gw/mulligan/store"
)

// SetAnnouncer installs the announcer for every handle on this database.
func (s *Store) SetAnnouncer(a store.Announcer) { s.sh.announcer.Store(&a) }

type announcerSlot = atomic.Pointer[store.Announcer]

// announce writes op's event, if any, in txn.
func (s *Store) announce(txn *badger.Txn, op *store.Operation, result *store.Response) error {
	ev := store.PendingEvent(s.sh.announcer.Load(), op, result)
	if ev == nil {
		return nil
	}
	return s.sh.putEvent(txn, ev, nil)
}

// DueEvents returns up to limit pending events whose next attempt is due between from and now,
// soonest first, read from the schedule index alone. A caller that knows no pending event is
// due before from spares the scan the tombstones of events delivered earlier (Badger keeps them
// until compaction).
func (s *Store) DueEvents(from, now time.Time, limit int) ([]store.Due, error) {
	var out []store.Due
	err := s.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefixPending), PrefetchValues: true, PrefetchSize: 64})
		defer it.Close()
		for it.Seek(pendingKey(from, "")); it.Valid() && len(out) < limit; it.Next() {
			k := it.Item().Key()[len(prefixPending):]
			if len(k) < 9 {
				continue
			}
			at := time.Unix(0, int64(binary.BigEndian.Uint64(k[:8])))
			if at.After(now) {
				break
			}
			noteRead(txn, it.Item())
			endpoint, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out = append(out, store.Due{ID: string(k[9:]), Endpoint: string(endpoint), At: at})
		}
		return nil
	})
	return out, err
}

// NextDue reports when the soonest pending event due at or after from is due (zero when none).
func (s *Store) NextDue(from time.Time) (time.Time, error) {
	var at time.Time
	err := s.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefixPending), PrefetchValues: false})
		defer it.Close()
		if it.Seek(pendingKey(from, "")); it.Valid() {
			k := it.Item().Key()[len(prefixPending):]
			at = time.Unix(0, int64(binary.BigEndian.Uint64(k[:8])))
		}
		return nil
	})
	return at, err
}

// ExpireDeadLetters deletes the dead letters dead-lettered before `before` and reports how many.
// The store does it by itself every few minutes (Options.DeadLetterRetention).
func (s *Store) ExpireDeadLetters(before time.Time) (int, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	n, err := s.sh.expireDeadLetters(before)
	return n, wrap(err)
}

// expireDeadLetters reads the dead-letter index alone, which holds each one's time of death,
// then deletes those dead before `before`, one short transaction each.
func (sh *shared) expireDeadLetters(before time.Time) (int, error) {
	var expired []string
	err := sh.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefixDead), PrefetchValues: true, PrefetchSize: 64})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			at, err := deadAt(txn, it.Item())
			if err != nil {
				return err
			}
			if at.Before(before) {
				expired = append(expired, string(it.Item().Key()[len(prefixDead):]))
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for i, id := range expired {
		var txn *badger.Txn
		err := sh.db.Update(func(t *badger.Txn) error { txn = t; return sh.deleteDead(t, id) })
		sh.counts.settle(txn, err == nil)
		if err != nil {
			return i, err
		}
	}
	return len(expired), nil
}

// deadAt reads a dead letter's time of death from its index entry (or, for an entry written
// before the index held it, from the event).
func deadAt(txn *badger.Txn, item *badger.Item) (time.Time, error) {
	v, err := item.ValueCopy(nil)
	if err != nil {
		return time.Time{}, err
	}
	if len(v) == 8 {
		return time.Unix(0, int64(binary.BigEndian.Uint64(v))), nil
	}
	ev, err := getEvent(txn, string(item.Key()[len(prefixDead):]))
	if err != nil {
		return time.Time{}, err
	}
	return ev.AgeStart(), nil
}

// deleteDead removes dead letter id, if it still is one.
func (sh *shared) deleteDead(txn *badger.Txn, id string) error {
	ev, err := getEvent(txn, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && ev.State != store.EventDead) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := txn.Delete([]byte(prefixDead + id)); err != nil {
		return err
	}
	sh.counts.add(txn, 0, -1)
	return txn.Delete([]byte(prefixEvent + id))
}

// GetEvent returns event id.
func (s *Store) GetEvent(id string) (*store.Event, error) {
	return read(s, getEvent, id)
}

// DeadLetters returns up to limit dead-lettered events, oldest id first, after `after`.
func (s *Store) DeadLetters(after string, limit int) ([]*store.Event, error) {
	var out []*store.Event
	err := s.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefixDead)})
		defer it.Close()
		for it.Seek([]byte(prefixDead + after)); it.Valid() && len(out) < limit; it.Next() {
			id := string(it.Item().Key()[len(prefixDead):])
			if id == after {
				continue
			}
			ev, err := getEvent(txn, id)
			if err != nil {
				return err
			}
			out = append(out, ev)
		}
		return nil
	})
	return out, err
}

// CountEvents reports how many events are pending and dead-lettered. The counts are kept as
// events change state, so a metrics scrape reads no event (see outboxCounts).
func (s *Store) CountEvents() (pending, dead int, err error) {
	if err := s.usable(); err != nil {
		return 0, 0, err
	}
	p, d := s.sh.counts.read()
	return int(p), int(d), nil
}

// SetEndpointState records an endpoint's state.
func (s *Store) SetEndpointState(name string, st store.EndpointState) error {
	return s.update(func(txn *badger.Txn) error {
		v, err := json.Marshal(st)
		if err != nil {
			return err
		}
		return txn.Set([]byte(prefixEndpoint+name), v)
	})
}

// GetEndpointState returns an endpoint's state (the zero state when none was recorded).
func (s *Store) GetEndpointState(name string) (store.EndpointState, error) {
	var st store.EndpointState
	err := s.view(func(txn *badger.Txn) error {
		err := getValue(txn, []byte(prefixEndpoint+name), func(v []byte) error { return json.Unmarshal(v, &st) })
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	})
	return st, err
}

func getEvent(txn *badger.Txn, id string) (*store.Event, error) {
	var ev store.Event
	err := getValue(txn, []byte(prefixEvent+id), func(v []byte) error { return json.Unmarshal(v, &ev) })
	return &ev, err
}

// putEvent stores ev and moves its index entries from prev's (nil for a new event), counting
// the change of state for CountEvents.
func (sh *shared) putEvent(txn *badger.Txn, ev *store.Event, prev *store.Event) error {
	var dPending, dDead int64
	if ev.State == store.EventPending {
		dPending++
	}
	if ev.State == store.EventDead {
		dDead++
	}
	if prev != nil {
		if prev.State == store.EventPending {
			dPending--
		}
		if prev.State == store.EventDead {
			dDead--
		}
	}
	sh.counts.add(txn, dPending, dDead)
	if prev != nil {
		if prev.State == store.EventPending {
			if err := txn.Delete(pendingKey(prev.NextAttempt, prev.ID)); err != nil {
				return err
			}
		}
		if prev.State == store.EventDead && ev.State != store.EventDead {
			if err := txn.Delete([]byte(prefixDead + ev.ID)); err != nil {
				return err
			}
		}
	}
	switch ev.State {
	case store.EventPending:
		if err := txn.Set(pendingKey(ev.NextAttempt, ev.ID), []byte(ev.Endpoint)); err != nil {
			return err
		}
	case store.EventDead:
		var at []byte // the time of death, read by ExpireDeadLetters
		if !ev.DeadAt.IsZero() {
			at = binary.BigEndian.AppendUint64(nil, uint64(ev.DeadAt.UnixNano()))
		}
		if err := txn.Set([]byte(prefixDead+ev.ID), at); err != nil {
			return err
		}
	}
	v, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	e := badger.NewEntry([]byte(prefixEvent+ev.ID), v)
	if ev.State == store.EventDelivered {
		e = e.WithTTL(store.DeliveredKeptFor)
	}
	return txn.SetEntry(e)
}

// pendingKey orders pending events by due time; times before 1970 (the zero time among them)
// sort first.
func pendingKey(due time.Time, id string) []byte {
	var ns uint64
	if due.After(time.Unix(0, 0)) {
		ns = uint64(due.UnixNano())
	}
	k := make([]byte, 0, len(prefixPending)+9+len(id))
	k = append(k, prefixPending...)
	k = binary.BigEndian.AppendUint64(k, ns)
	k = append(k, '/')
	return append(k, id...)
}

// RescheduleEndpoint makes every pending event of endpoint due at `at`; it returns how many.
func (s *Store) RescheduleEndpoint(endpoint string, at time.Time) (int, error) {
	due, err := s.DueEvents(time.Time{}, time.Unix(0, 1<<62), 1<<30)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, ev := range due {
		if ev.Endpoint != endpoint {
			continue
		}
		if err := s.Reschedule(ev.ID, at, store.Attempt{}); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

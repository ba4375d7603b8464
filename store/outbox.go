package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// EventState is where a webhook event is in the outbox.
type EventState string

// The outbox states: pending until delivered or dead-lettered.
const (
	EventPending   EventState = "pending"
	EventDelivered EventState = "delivered"
	EventDead      EventState = "dead"
)

// DeliveredKeptFor is how long a delivered event stays readable, for operators.
const DeliveredKeptFor = 24 * time.Hour

// Event is one webhook event in the durable outbox.
type Event struct {
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	OperationID string          `json:"operation_id"`
	Version     int64           `json:"version"`
	Endpoint    string          `json:"endpoint"`
	URL         string          `json:"url"`
	OccurredAt  time.Time       `json:"occurred_at"`
	Operation   json.RawMessage `json:"operation"`
	State       EventState      `json:"state"`
	Attempts    int             `json:"attempts"`
	NextAttempt time.Time       `json:"next_attempt,omitzero"`
	LastStatus  int             `json:"last_status,omitempty"`
	LastError   string          `json:"last_error,omitempty"`
	DeadReason  string          `json:"dead_reason,omitempty"`
	DeliveredAt time.Time       `json:"delivered_at,omitzero"`
	// AgeFrom is when a redelivered event's max_age starts again (zero: from OccurredAt).
	AgeFrom time.Time `json:"age_from,omitzero"`
	// Traceparent and Tracestate are the operation's W3C Trace Context, sent as headers with
	// every delivery so the consumer's work joins the same trace.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
}

// AgeStart is when the event's max_age is counted from: its redelivery, else its occurrence.
func (ev *Event) AgeStart() time.Time {
	if ev.AgeFrom.After(ev.OccurredAt) {
		return ev.AgeFrom
	}
	return ev.OccurredAt
}

// Callback is where an operation's events go.
type Callback struct {
	Endpoint string `json:"endpoint"`
	URL      string `json:"url"`
}

// Announcer returns the event that announces op's new status (result is the stored upstream
// response, when the change brings one), or nil when nothing is to be announced. It runs
// inside the transaction of the status change, so no status change is stored without its
// event.
type Announcer func(op *Operation, result *Response) *Event

// SetAnnouncer installs the announcer for every handle on this database.
func (s *Store) SetAnnouncer(a Announcer) { s.sh.announcer.Store(&a) }

type announcerSlot = atomic.Pointer[Announcer]

// announce writes op's event, if any, in txn.
func (s *Store) announce(txn *badger.Txn, op *Operation, result *Response) error {
	a := s.sh.announcer.Load()
	if a == nil || *a == nil {
		return nil
	}
	ev := (*a)(op, result)
	if ev == nil {
		return nil
	}
	ev.State, ev.NextAttempt = EventPending, ev.OccurredAt
	return putEvent(txn, ev, nil)
}

// Due is a pending event in the schedule: enough to decide whether to deliver it now.
type Due struct {
	ID       string
	Endpoint string
	At       time.Time
}

// DueEvents returns up to limit pending events whose next attempt is due between from and now,
// soonest first, read from the schedule index alone. A caller that knows no pending event is
// due before from spares the scan the tombstones of events delivered earlier (Badger keeps them
// until compaction).
func (s *Store) DueEvents(from, now time.Time, limit int) ([]Due, error) {
	var out []Due
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
			endpoint, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out = append(out, Due{ID: string(k[9:]), Endpoint: string(endpoint), At: at})
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

// UpdateEvent applies fn to event id and stores it, keeping the pending and dead-letter
// indexes in step with its state.
func (s *Store) UpdateEvent(id string, fn func(ev *Event)) (*Event, error) {
	var out *Event
	err := s.update(func(txn *badger.Txn) error {
		ev, err := getEvent(txn, id)
		if err != nil {
			return err
		}
		prev := *ev
		fn(ev)
		out = ev
		return putEvent(txn, ev, &prev)
	})
	return out, err
}

// GetEvent returns event id.
func (s *Store) GetEvent(id string) (*Event, error) {
	var ev *Event
	err := s.view(func(txn *badger.Txn) error {
		var err error
		ev, err = getEvent(txn, id)
		return err
	})
	return ev, err
}

// DeadLetters returns up to limit dead-lettered events, oldest id first, after `after`.
func (s *Store) DeadLetters(after string, limit int) ([]*Event, error) {
	var out []*Event
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

// CountEvents counts pending and dead-lettered events.
func (s *Store) CountEvents() (pending, dead int, err error) {
	err = s.view(func(txn *badger.Txn) error {
		pending = countPrefix(txn, prefixPending)
		dead = countPrefix(txn, prefixDead)
		return nil
	})
	return pending, dead, err
}

func countPrefix(txn *badger.Txn, prefix string) int {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix)})
	defer it.Close()
	n := 0
	for it.Rewind(); it.Valid(); it.Next() {
		n++
	}
	return n
}

// EndpointState is an endpoint's lasting condition: disabled after a 410 until re-enabled.
type EndpointState struct {
	Disabled   bool      `json:"disabled"`
	DisabledAt time.Time `json:"disabled_at,omitzero"`
	Reason     string    `json:"reason,omitempty"`
}

// SetEndpointState records an endpoint's state.
func (s *Store) SetEndpointState(name string, st EndpointState) error {
	return s.update(func(txn *badger.Txn) error {
		v, err := json.Marshal(st)
		if err != nil {
			return err
		}
		return txn.Set([]byte(prefixEndpoint+name), v)
	})
}

// GetEndpointState returns an endpoint's state (the zero state when none was recorded).
func (s *Store) GetEndpointState(name string) (EndpointState, error) {
	var st EndpointState
	err := s.view(func(txn *badger.Txn) error {
		err := getValue(txn, []byte(prefixEndpoint+name), func(v []byte) error { return json.Unmarshal(v, &st) })
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	})
	return st, err
}

func getEvent(txn *badger.Txn, id string) (*Event, error) {
	var ev Event
	err := getValue(txn, []byte(prefixEvent+id), func(v []byte) error { return json.Unmarshal(v, &ev) })
	return &ev, err
}

// putEvent stores ev and moves its index entries from prev's (nil for a new event).
func putEvent(txn *badger.Txn, ev *Event, prev *Event) error {
	if prev != nil {
		if prev.State == EventPending {
			if err := txn.Delete(pendingKey(prev.NextAttempt, prev.ID)); err != nil {
				return err
			}
		}
		if prev.State == EventDead && ev.State != EventDead {
			if err := txn.Delete([]byte(prefixDead + ev.ID)); err != nil {
				return err
			}
		}
	}
	switch ev.State {
	case EventPending:
		if err := txn.Set(pendingKey(ev.NextAttempt, ev.ID), []byte(ev.Endpoint)); err != nil {
			return err
		}
	case EventDead:
		if err := txn.Set([]byte(prefixDead+ev.ID), nil); err != nil {
			return err
		}
	}
	v, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	e := badger.NewEntry([]byte(prefixEvent+ev.ID), v)
	if ev.State == EventDelivered {
		e = e.WithTTL(DeliveredKeptFor)
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
		if _, err := s.UpdateEvent(ev.ID, func(e *Event) {
			if e.State == EventPending {
				e.NextAttempt = at
			}
		}); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

package badger

import (
	"encoding/binary"
	"errors"
	"net/http"
	"strconv"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/mulligan-gw/mulligan/store"
)

// streamHead is the stored state of a stream, rewritten with every batch of events.
type streamHead struct {
	Token     string            `json:"token"`
	State     store.StreamState `json:"state"`
	Status    int               `json:"status"`
	Header    http.Header       `json:"header,omitempty"`
	Events    uint64            `json:"events"`
	Bytes     int64             `json:"bytes"`
	KeepUntil int64             `json:"keep_until"` // unix seconds: the events' expiry
}

// A batch of events is stored as one segment, on every backend: a fast stream costs one write
// per batch, not one per event. A segment is each event's id and data, length-prefixed.

// BeginStream implements StreamRecorder. A previous attempt's stream under the same key is
// replaced: its events are left to expire. Like AppendEvents it does not wait for an fsync, so
// the first event is not held up by one.
func (s *Store) BeginStream(key []byte, token string, status int, header http.Header, keep time.Duration) error {
	if err := s.usable(); err != nil {
		return err
	}
	unlock := s.locks.lock(key)
	defer unlock()
	return wrap(s.sh.db.Update(func(txn *badger.Txn) error {
		if _, err := heldRecord(txn, key, token); err != nil {
			return err
		}
		head := &streamHead{Token: token, State: store.StreamLive, Status: status, Header: header, KeepUntil: s.now().Add(keep).Unix()}
		return putHead(txn, key, head)
	}))
}

// AppendEvents implements StreamRecorder. The batch is stored as one segment, keyed by the
// position of its first event: a fast stream costs one write per batch, not one per event, and
// a slow one (a batch per event) one per event. It commits without waiting for an fsync: a
// partial recording is worth nothing after a crash (it is never replayed), and FinishStream's
// fsync covers every event written before it.
func (s *Store) AppendEvents(key []byte, token string, events []store.StreamEvent) error {
	if len(events) == 0 {
		return nil
	}
	if err := s.usable(); err != nil {
		return err
	}
	unlock := s.locks.lock(key)
	defer unlock()
	return wrap(s.sh.db.Update(func(txn *badger.Txn) error {
		head, err := liveHead(txn, key, token)
		if err != nil {
			return err
		}
		first := head.Events + 1
		for _, e := range events {
			head.Events++
			head.Bytes += int64(len(e.Data))
			if err := indexEventID(txn, key, head, e.ID); err != nil {
				return err
			}
		}
		entry := badger.NewEntry(streamEventKey(key, token, first), store.EncodeSegment(nil, events))
		entry.ExpiresAt = uint64(head.KeepUntil)
		if err := txn.SetEntry(entry); err != nil {
			return err
		}
		return putHead(txn, key, head)
	}))
}

// ReadEvents implements StreamRecorder. A stream whose claim is gone or ran out of lease (its
// gateway died) reads as aborted.
func (s *Store) ReadEvents(key []byte, after uint64, limit int) (store.StreamPage, error) {
	var page store.StreamPage
	err := s.view(func(txn *badger.Txn) error {
		head, err := getHead(txn, key)
		if err != nil || head == nil {
			return err
		}
		page = store.StreamPage{State: head.State, Token: head.Token, Status: head.Status, Header: head.Header, Events: head.Events, Bytes: head.Bytes}
		if head.State == store.StreamLive {
			rec, err := getRecord(txn, key)
			if err != nil {
				return err
			}
			if rec == nil || rec.State != store.InFlight || rec.Token != head.Token || !s.now().Before(rec.LeaseUntil) {
				page.State = store.StreamAborted
			}
		}
		if limit <= 0 || after >= head.Events {
			return nil
		}
		page.List, err = readStreamEvents(txn, key, head.Token, after, limit)
		return err
	})
	return page, err
}

// FindEvent implements StreamRecorder: an upstream's own id is looked up in the id index, a
// gateway-assigned one is the event's position.
func (s *Store) FindEvent(key []byte, id string) (uint64, bool, error) {
	var seq uint64
	var found bool
	err := s.view(func(txn *badger.Txn) error {
		head, err := getHead(txn, key)
		if err != nil || head == nil {
			return err
		}
		item, err := txn.Get(streamIDKey(key, head.Token, id))
		switch {
		case err == nil:
			return item.Value(func(v []byte) error {
				if len(v) != 8 {
					return store.ErrCorrupt
				}
				seq, found = binary.BigEndian.Uint64(v), true
				return nil
			})
		case !errors.Is(err, badger.ErrKeyNotFound):
			return err
		}
		if n, perr := strconv.ParseUint(id, 10, 64); perr == nil && n >= 1 && n <= head.Events {
			seq, found = n, true
		}
		return nil
	})
	return seq, found, err
}

// FinishStream implements StreamRecorder: the record completes and the stream is marked whole
// in one transaction, durable before it returns under a durable store.
func (s *Store) FinishStream(key []byte, token string, expires time.Time) error {
	unlock := s.locks.lock(key)
	defer unlock()
	return s.update(func(txn *badger.Txn) error {
		head, err := liveHead(txn, key, token)
		if err != nil {
			return err
		}
		rec, err := heldRecord(txn, key, token)
		if err != nil {
			return err
		}
		if keep := time.Unix(head.KeepUntil, 0); expires.After(keep) {
			expires = keep // the events go at KeepUntil: the record must not outlive them
		}
		head.State = store.StreamFinished
		if err := putHead(txn, key, head); err != nil {
			return err
		}
		rec.State, rec.Token, rec.LeaseUntil, rec.ExpiresAt, rec.Streamed = store.Completed, "", time.Time{}, expires, true
		rec.Response = &store.Response{Status: head.Status, Header: head.Header}
		return putRecord(txn, key, rec, time.Until(expires))
	})
}

// AbortStream implements StreamRecorder: the stream is marked aborted and the key released in
// one transaction; then its events are deleted.
func (s *Store) AbortStream(key []byte, token string) error {
	unlock := s.locks.lock(key)
	err := s.update(func(txn *badger.Txn) error {
		head, err := getHead(txn, key)
		if err != nil {
			return err
		}
		if head != nil && head.Token == token {
			head.State = store.StreamAborted
			if err := putHead(txn, key, head); err != nil {
				return err
			}
		}
		rec, err := getRecord(txn, key)
		if err != nil || rec == nil || rec.State != store.InFlight || rec.Token != token {
			return err // the claim is already gone: nothing to release
		}
		return txn.Delete(idempotencyKey(key))
	})
	unlock()
	if err != nil {
		return err
	}
	return s.dropEvents(key, token)
}

// DropStream implements StreamRecorder.
func (s *Store) DropStream(key []byte, token string) error {
	unlock := s.locks.lock(key)
	err := s.update(func(txn *badger.Txn) error {
		head, err := liveHead(txn, key, token)
		if err != nil {
			return err
		}
		head.State = store.StreamAborted
		return putHead(txn, key, head)
	})
	unlock()
	if err != nil {
		return err
	}
	return s.dropEvents(key, token)
}

// dropEvents deletes the events and id index of one attempt's stream.
func (s *Store) dropEvents(key []byte, token string) error {
	wb := s.sh.db.NewWriteBatch()
	defer wb.Cancel()
	err := s.view(func(txn *badger.Txn) error {
		for _, prefix := range [][]byte{streamEventPrefix(key, token), streamIDPrefix(key, token)} {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
			for it.Rewind(); it.Valid(); it.Next() {
				if err := wb.Delete(it.Item().KeyCopy(nil)); err != nil {
					it.Close()
					return err
				}
			}
			it.Close()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return wrap(wb.Flush())
}

func liveHead(txn *badger.Txn, key []byte, token string) (*streamHead, error) {
	head, err := getHead(txn, key)
	if err != nil {
		return nil, err
	}
	if head == nil || head.Token != token || head.State != store.StreamLive {
		return nil, domainError{store.ErrStreamNotLive}
	}
	return head, nil
}

func getHead(txn *badger.Txn, key []byte) (*streamHead, error) {
	item, err := txn.Get(streamHeadKey(key))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	head := new(streamHead)
	err = item.Value(func(v []byte) error {
		_, derr := store.Decode(v, head)
		return derr
	})
	return head, err
}

func putHead(txn *badger.Txn, key []byte, head *streamHead) error {
	v, err := store.Encode(head, nil)
	if err != nil {
		return err
	}
	e := badger.NewEntry(streamHeadKey(key), v)
	e.ExpiresAt = uint64(head.KeepUntil)
	return txn.SetEntry(e)
}

// indexEventID indexes the id of event number head.Events when it is the upstream's own (a
// gateway-assigned id is the position itself).
func indexEventID(txn *badger.Txn, key []byte, head *streamHead, id string) error {
	if id == "" || id == strconv.FormatUint(head.Events, 10) {
		return nil
	}
	ix := badger.NewEntry(streamIDKey(key, head.Token, id), binary.BigEndian.AppendUint64(nil, head.Events))
	ix.ExpiresAt = uint64(head.KeepUntil)
	return txn.SetEntry(ix)
}

// readStreamEvents reads at most limit events after position after: from the segment that
// holds event after+1 (the last one starting at or before it) on.
func readStreamEvents(txn *badger.Txn, key []byte, token string, after uint64, limit int) ([]store.StreamEvent, error) {
	prefix := streamEventPrefix(key, token)
	start := prefix
	back := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: true})
	if back.Seek(streamEventKey(key, token, after+1)); back.Valid() {
		start = back.Item().KeyCopy(nil)
	}
	back.Close()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 4})
	defer it.Close()
	var out []store.StreamEvent
	for it.Seek(start); it.Valid() && len(out) < limit; it.Next() {
		first := binary.BigEndian.Uint64(it.Item().Key()[len(prefix):])
		err := it.Item().Value(func(v []byte) error {
			var err error
			out, err = store.DecodeSegment(v, first, after, limit, out)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

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
	Worker    string            `json:"worker,omitempty"` // an operation's stream: the worker fencing it
	State     store.StreamState `json:"state"`
	Status    int               `json:"status"`
	Header    http.Header       `json:"header,omitempty"`
	Events    uint64            `json:"events"`
	Bytes     int64             `json:"bytes"`
	KeepUntil int64             `json:"keep_until"` // unix seconds: the events' expiry
}

// A batch of events is stored as one segment, on every backend: a fast stream costs one write
// per batch, not one per event. A segment is each event's id and data, length-prefixed.

// BeginStream implements StreamRecorder. A previous attempt's stream under the same id is
// replaced: its events are left to expire. The fence is read in the transaction that writes the
// head, so a takeover committed meanwhile makes it conflict and be tried again, and refused.
// Like AppendEvents it does not wait for an fsync, so the first event is not held up by one.
func (s *Store) BeginStream(stream []byte, h store.StreamHolder, status int, header http.Header, keep time.Duration) error {
	unlock := s.locks.lock(stream)
	defer unlock()
	return s.updateRelaxed(func(txn *badger.Txn) error {
		if err := s.holds(txn, stream, h); err != nil {
			return err
		}
		head := &streamHead{Token: h.Token, Worker: h.Worker, State: store.StreamLive, Status: status, Header: header, KeepUntil: s.now().Add(keep).Unix()}
		return putHead(txn, stream, head)
	})
}

// AppendEvents implements StreamRecorder. The batch is stored as one segment, keyed by the
// position of its first event: a fast stream costs one write per batch, not one per event, and
// a slow one (a batch per event) one per event. It commits without waiting for an fsync: a
// partial recording is worth nothing after a crash (it is never replayed), and FinishStream's
// fsync covers every event written before it.
func (s *Store) AppendEvents(stream []byte, h store.StreamHolder, events []store.StreamEvent) error {
	if len(events) == 0 {
		return nil
	}
	unlock := s.locks.lock(stream)
	defer unlock()
	return s.updateRelaxed(func(txn *badger.Txn) error {
		head, err := s.liveHead(txn, stream, h)
		if err != nil {
			return err
		}
		first := head.Events + 1
		for _, e := range events {
			head.Events++
			head.Bytes += int64(len(e.Data))
			if err := indexEventID(txn, stream, head, e.ID); err != nil {
				return err
			}
		}
		entry := badger.NewEntry(streamEventKey(stream, h.Token, first), store.EncodeSegment(nil, events))
		entry.ExpiresAt = uint64(head.KeepUntil)
		if err := txn.SetEntry(entry); err != nil {
			return err
		}
		return putHead(txn, stream, head)
	})
}

// ReadEvents implements StreamRecorder. A live stream whose holder no longer holds reads as
// aborted.
func (s *Store) ReadEvents(stream []byte, after uint64, limit int) (store.StreamPage, error) {
	var page store.StreamPage
	err := s.view(func(txn *badger.Txn) error {
		head, err := getHead(txn, stream)
		if err != nil || head == nil {
			return err
		}
		page = store.StreamPage{State: head.State, Token: head.Token, Status: head.Status, Header: head.Header, Events: head.Events, Bytes: head.Bytes}
		if head.State == store.StreamLive {
			held, err := s.stillHeld(txn, stream, head)
			if err != nil {
				return err
			}
			if !held {
				page.State = store.StreamAborted
			}
		}
		if limit <= 0 || after >= head.Events {
			return nil
		}
		page.List, err = readStreamEvents(txn, stream, head.Token, after, limit)
		return err
	})
	return page, err
}

// FindEvent implements StreamRecorder: an upstream's own id is looked up in the id index, a
// gateway-assigned one is the event's position.
func (s *Store) FindEvent(stream []byte, id string) (uint64, bool, error) {
	var seq uint64
	var found bool
	err := s.view(func(txn *badger.Txn) error {
		head, err := getHead(txn, stream)
		if err != nil || head == nil {
			return err
		}
		item, err := txn.Get(streamIDKey(stream, head.Token, id))
		switch {
		case err == nil:
			return item.Value(func(v []byte) error {
				if len(v) != 8 {
					return store.ErrCorrupt
				}
				seq = binary.BigEndian.Uint64(v)
				found = seq > 0 // 0: the upstream repeated the id (indexEventID)
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

// FinishStream implements StreamRecorder: the stream is marked whole and, for a keyed stream,
// the record completed, in one transaction, durable before it returns under a durable store.
func (s *Store) FinishStream(stream []byte, h store.StreamHolder, expires time.Time) error {
	unlock := s.locks.lock(stream)
	defer unlock()
	return s.update(func(txn *badger.Txn) error {
		head, err := s.liveHead(txn, stream, h)
		if err != nil {
			return err
		}
		if keep := time.Unix(head.KeepUntil, 0); expires.After(keep) {
			expires = keep // the events go at KeepUntil: the record must not outlive them
		}
		head.State = store.StreamFinished
		if h.Worker != "" {
			head.KeepUntil = expires.Unix() // an operation's stream: its result answers after that
			return putHead(txn, stream, head)
		}
		if err := putHead(txn, stream, head); err != nil {
			return err
		}
		rec, err := heldRecord(txn, stream, h.Token)
		if err != nil {
			return err
		}
		rec.State, rec.Token, rec.LeaseUntil, rec.ExpiresAt, rec.Streamed = store.Completed, "", time.Time{}, expires, true
		rec.Response = &store.Response{Status: head.Status, Header: head.Header}
		return putRecord(txn, stream, rec, time.Until(expires))
	})
}

// AbortStream implements store.StreamRecorder: while h still holds, the stream is marked aborted
// and, for a keyed stream, the key released, in one transaction; then its events are deleted. A
// holder that no longer holds is left alone: a FinishStream whose commit landed although its
// caller saw an error must go on replaying, not be aborted afterwards.
func (s *Store) AbortStream(stream []byte, h store.StreamHolder) error {
	unlock := s.locks.lock(stream)
	held := false
	err := s.update(func(txn *badger.Txn) error {
		switch err := s.holds(txn, stream, h); {
		case errors.Is(err, store.ErrNotHolder):
			return nil // the claim or the operation is already gone: nothing to do
		case err != nil:
			return err
		}
		held = true
		head, err := getHead(txn, stream)
		if err != nil {
			return err
		}
		if head != nil && head.Token == h.Token {
			if head.State == store.StreamFinished {
				held = false // a finish that landed although its caller saw an error: it stays whole
				return nil
			}
			head.State = store.StreamAborted
			if err := putHead(txn, stream, head); err != nil {
				return err
			}
		}
		if h.Worker != "" {
			return nil
		}
		return txn.Delete(idempotencyKey(stream))
	})
	unlock()
	if err != nil || !held {
		return err
	}
	return s.dropEvents(stream, h.Token)
}

// DropStream implements StreamRecorder.
func (s *Store) DropStream(stream []byte, h store.StreamHolder) error {
	unlock := s.locks.lock(stream)
	err := s.update(func(txn *badger.Txn) error {
		head, err := s.liveHead(txn, stream, h)
		if err != nil {
			return err
		}
		head.State = store.StreamAborted
		return putHead(txn, stream, head)
	})
	unlock()
	if err != nil {
		return err
	}
	return s.dropEvents(stream, h.Token)
}

// holds checks, in txn, that h holds stream: a keyed stream's key is in flight under h.Token;
// an operation's stream's operation runs under h.Worker (ErrNotHolder otherwise). Reading the
// fence in the writing transaction makes a concurrent takeover conflict with the write.
func (s *Store) holds(txn *badger.Txn, stream []byte, h store.StreamHolder) error {
	if h.Worker == "" {
		_, err := heldRecord(txn, stream, h.Token)
		return err
	}
	op, err := getOperation(txn, string(stream))
	if errors.Is(err, store.ErrNotFound) {
		return domainError{store.ErrNotHolder}
	}
	if err != nil {
		return err
	}
	if op.Status != store.StatusRunning || op.Holder != h.Worker {
		return domainError{store.ErrNotHolder}
	}
	return nil
}

// stillHeld reports whether the holder of a live stream's head still holds, its lease not run
// out (a dead gateway's stream reads as aborted).
func (s *Store) stillHeld(txn *badger.Txn, stream []byte, head *streamHead) (bool, error) {
	now := s.now()
	if head.Worker == "" {
		rec, err := getRecord(txn, stream)
		return rec != nil && rec.State == store.InFlight && rec.Token == head.Token && now.Before(rec.LeaseUntil), err
	}
	op, err := getOperation(txn, string(stream))
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return op.Status == store.StatusRunning && op.Holder == head.Worker && s.sh.queue.holds(op.ID, head.Worker, now), nil
}

// liveHead returns the head of the stream h writes, while it is live under h and h holds.
func (s *Store) liveHead(txn *badger.Txn, stream []byte, h store.StreamHolder) (*streamHead, error) {
	head, err := getHead(txn, stream)
	if err != nil {
		return nil, err
	}
	if head == nil || head.Token != h.Token || head.Worker != h.Worker || head.State != store.StreamLive {
		return nil, domainError{store.ErrStreamNotLive}
	}
	return head, s.holds(txn, stream, h)
}

// updateRelaxed runs fn in a read-write transaction, retrying on optimistic conflicts (a claim
// or transition of the fence committed meanwhile), without waiting for an fsync.
func (s *Store) updateRelaxed(fn func(txn *badger.Txn) error) error {
	if err := s.usable(); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		err := s.sh.db.Update(fn)
		if errors.Is(err, badger.ErrConflict) && attempt < 64 {
			continue
		}
		return wrap(err)
	}
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
	if err == nil && head.State != store.StreamLive {
		noteRead(txn, item) // an ended stream replays: durable first (a live one is followed as it streams)
	}
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
// gateway-assigned id is the position itself). An id seen again is ambiguous: its entry becomes
// position 0, which FindEvent never finds, so Last-Event-ID resumes only after an id that is
// unique in the stream, as on every backend (docs/streams.md).
func indexEventID(txn *badger.Txn, key []byte, head *streamHead, id string) error {
	if id == "" || id == strconv.FormatUint(head.Events, 10) {
		return nil
	}
	seq := head.Events
	switch _, err := txn.Get(streamIDKey(key, head.Token, id)); {
	case err == nil:
		seq = 0
	case !errors.Is(err, badger.ErrKeyNotFound):
		return err
	}
	ix := badger.NewEntry(streamIDKey(key, head.Token, id), binary.BigEndian.AppendUint64(nil, seq))
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

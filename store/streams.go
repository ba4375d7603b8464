package store

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// StreamRecorder is what a recorded event stream needs of storage (docs/streams.md): the events
// of a keyed Server-Sent Events answer are appended one batch at a time while the answer is
// relayed, read back by position by those who join or replay it, and finished (the key then
// replays the stream) or aborted (the key is released). Every call names the stream by its
// idempotency record key; the writing calls also present the claim's token, so an attempt that
// lost its claim can never write into the next attempt's stream.
type StreamRecorder interface {
	// BeginStream starts the stream of the claim held under token, with the answer's status
	// and headers; its events are kept for at most keep.
	BeginStream(key []byte, token string, status int, header http.Header, keep time.Duration) error
	// AppendEvents appends events, numbered on from the last one appended.
	AppendEvents(key []byte, token string, events []StreamEvent) error
	// ReadEvents returns the stream's state and at most limit events after position after.
	ReadEvents(key []byte, after uint64, limit int) (StreamPage, error)
	// FindEvent returns the position of the event with the given id, if the stream has it.
	FindEvent(key []byte, id string) (uint64, bool, error)
	// FinishStream completes the key held under token: from then on it replays the stream,
	// until expires.
	FinishStream(key []byte, token string, expires time.Time) error
	// AbortStream ends the stream as broken and releases the key held under token at once.
	AbortStream(key []byte, token string) error
	// DropStream gives up recording a stream that is still being relayed (it passed
	// max_result, or a write failed): from then on it reads as aborted, so joiners everywhere
	// see it end and new duplicates do not join it, and its events are deleted; the key stays
	// claimed under token until the attempt ends (AbortStream then releases it).
	DropStream(key []byte, token string) error
}

// StreamState is where a recorded stream is in its life.
type StreamState uint8

const (
	// StreamNone: the key has no stream.
	StreamNone StreamState = iota
	// StreamLive: the upstream is still answering; more events may come.
	StreamLive
	// StreamFinished: the upstream ended the answer; the stream is whole and replays.
	StreamFinished
	// StreamAborted: the answer broke off (the upstream, the size limit, or a gateway that died
	// with its claim); what was recorded is never replayed as whole.
	StreamAborted
)

// StreamEvent is one event of a stream, as relayed.
type StreamEvent struct {
	// Seq is the event's position in the stream, from 1.
	Seq uint64
	// ID is the event's id as relayed (the upstream's, or the gateway's: Seq in decimal).
	ID string
	// Data is the event's bytes as relayed, its closing blank line included.
	Data []byte
}

// StreamPage is a stream's state with a page of its events.
type StreamPage struct {
	State StreamState
	// Token is the claim whose attempt the stream records.
	Token  string
	Status int
	Header http.Header
	// Events and Bytes count what was recorded so far.
	Events uint64
	Bytes  int64
	// List holds the events read, in order.
	List []StreamEvent
}

// streamHead is the stored state of a stream, rewritten with every batch of events.
type streamHead struct {
	Token     string      `json:"token"`
	State     StreamState `json:"state"`
	Status    int         `json:"status"`
	Header    http.Header `json:"header,omitempty"`
	Events    uint64      `json:"events"`
	Bytes     int64       `json:"bytes"`
	KeepUntil int64       `json:"keep_until"` // unix seconds: the events' expiry
}

// ErrStreamNotLive answers a write to a stream that is not live under the given claim: it was
// finished, aborted, or replaced by another attempt.
var ErrStreamNotLive = errors.New("stream is not live under this claim")

// A batch of events is stored as one segment, on every backend: a fast stream costs one write
// per batch, not one per event. A segment is each event's id and data, length-prefixed.

// EncodeSegment appends the segment of events to dst.
func EncodeSegment(dst []byte, events []StreamEvent) []byte {
	size := 0
	for _, e := range events {
		size += len(e.ID) + len(e.Data) + 2*binary.MaxVarintLen32
	}
	dst = slices.Grow(dst, size)
	for _, e := range events {
		dst = appendBytes(appendBytes(dst, []byte(e.ID)), e.Data)
	}
	return dst
}

// DecodeSegment reads a segment whose first event is at position first and appends to out its
// events after position after, up to limit events in out.
func DecodeSegment(seg []byte, first, after uint64, limit int, out []StreamEvent) ([]StreamEvent, error) {
	d := &decoder{b: seg}
	for seq := first; len(d.b) > 0 && len(out) < limit; seq++ {
		id, data := d.bytes(), d.bytes()
		if d.err {
			return out, errCorrupt
		}
		if seq > after {
			out = append(out, StreamEvent{Seq: seq, ID: string(id), Data: data})
		}
	}
	return out, nil
}

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
		head := &streamHead{Token: token, State: StreamLive, Status: status, Header: header, KeepUntil: s.now().Add(keep).Unix()}
		return putHead(txn, key, head)
	}))
}

// AppendEvents implements StreamRecorder. The batch is stored as one segment, keyed by the
// position of its first event: a fast stream costs one write per batch, not one per event, and
// a slow one (a batch per event) one per event. It commits without waiting for an fsync: a
// partial recording is worth nothing after a crash (it is never replayed), and FinishStream's
// fsync covers every event written before it.
func (s *Store) AppendEvents(key []byte, token string, events []StreamEvent) error {
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
		entry := badger.NewEntry(streamEventKey(key, token, first), EncodeSegment(nil, events))
		entry.ExpiresAt = uint64(head.KeepUntil)
		if err := txn.SetEntry(entry); err != nil {
			return err
		}
		return putHead(txn, key, head)
	}))
}

// ReadEvents implements StreamRecorder. A stream whose claim is gone or ran out of lease (its
// gateway died) reads as aborted.
func (s *Store) ReadEvents(key []byte, after uint64, limit int) (StreamPage, error) {
	var page StreamPage
	err := s.view(func(txn *badger.Txn) error {
		head, err := getHead(txn, key)
		if err != nil || head == nil {
			return err
		}
		page = StreamPage{State: head.State, Token: head.Token, Status: head.Status, Header: head.Header, Events: head.Events, Bytes: head.Bytes}
		if head.State == StreamLive {
			rec, err := getRecord(txn, key)
			if err != nil {
				return err
			}
			if rec == nil || rec.State != InFlight || rec.Token != head.Token || !s.now().Before(rec.LeaseUntil) {
				page.State = StreamAborted
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
					return errCorrupt
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
		head.State = StreamFinished
		if err := putHead(txn, key, head); err != nil {
			return err
		}
		rec.State, rec.Token, rec.LeaseUntil, rec.ExpiresAt, rec.Streamed = Completed, "", time.Time{}, expires, true
		rec.Response = &Response{Status: head.Status, Header: head.Header}
		return putRecord(txn, key, rec, time.Until(expires))
	})
}

// AbortStream implements StreamRecorder: while the key is still in flight under token, the
// stream is marked aborted and the key released in one transaction; then its events are
// deleted. A key no longer held under token is left alone: a FinishStream whose commit landed
// although its caller saw an error must go on replaying, not be aborted afterwards.
func (s *Store) AbortStream(key []byte, token string) error {
	unlock := s.locks.lock(key)
	held := false
	err := s.update(func(txn *badger.Txn) error {
		rec, err := getRecord(txn, key)
		if err != nil || rec == nil || rec.State != InFlight || rec.Token != token {
			return err // the claim is already gone (finished, released, taken over): nothing to do
		}
		held = true
		head, err := getHead(txn, key)
		if err != nil {
			return err
		}
		if head != nil && head.Token == token {
			head.State = StreamAborted
			if err := putHead(txn, key, head); err != nil {
				return err
			}
		}
		return txn.Delete(idempotencyKey(key))
	})
	unlock()
	if err != nil || !held {
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
		head.State = StreamAborted
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
	if head == nil || head.Token != token || head.State != StreamLive {
		return nil, domainError{ErrStreamNotLive}
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
		_, derr := decode(v, head)
		return derr
	})
	return head, err
}

func putHead(txn *badger.Txn, key []byte, head *streamHead) error {
	v, err := encode(head, nil)
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
func readStreamEvents(txn *badger.Txn, key []byte, token string, after uint64, limit int) ([]StreamEvent, error) {
	prefix := streamEventPrefix(key, token)
	start := prefix
	back := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: true})
	if back.Seek(streamEventKey(key, token, after+1)); back.Valid() {
		start = back.Item().KeyCopy(nil)
	}
	back.Close()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 4})
	defer it.Close()
	var out []StreamEvent
	for it.Seek(start); it.Valid() && len(out) < limit; it.Next() {
		first := binary.BigEndian.Uint64(it.Item().Key()[len(prefix):])
		err := it.Item().Value(func(v []byte) error {
			var err error
			out, err = DecodeSegment(v, first, after, limit, out)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

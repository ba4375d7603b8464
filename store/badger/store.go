// Package badger is the Badger backend of store.Backend: one process, one directory, one
// database per directory shared by every handle opened on it, writes group-committed
// (docs/backends.md). store/postgres is the PostgreSQL one; both pass store/storetest.
package badger

import (
	"errors"
	"fmt"
	"os"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/mulligan-gw/mulligan/store"
)

// Options configures a Store.
type Options struct {
	// Dir is the database directory. One database is opened per directory and shared by every
	// Store opened on it (see Open).
	Dir string
	// EncryptionKey enables encryption at rest when set (AES; 16, 24 or 32 bytes).
	EncryptionKey []byte
	// Sync makes every write durable (fsynced) before the call that made it returns. Concurrent
	// writers share one fsync (group commit).
	Sync bool
	// Logger receives the database's warnings and errors; nil discards them.
	Logger store.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// pageOutEvery is how often older value logs are paged out (resident.go): 0 is
	// residentEvery, below 0 never (tests that page out themselves).
	pageOutEvery time.Duration
	// Memory sizes Badger's memtables, caches and value-log files; zero fields take
	// DefaultMemory's. The first handle to open a directory sets it.
	Memory Memory
	// DeadLetterRetention is how long a dead letter is kept after it was dead-lettered; zero
	// means DefaultDeadLetterRetention. The first handle to open a directory sets it.
	DeadLetterRetention time.Duration
}

// Store is one user's handle on a shared database. Close releases the handle; the database
// closes when its last handle does.
type Store struct {
	sh     *shared
	sync   bool
	now    func() time.Time
	locks  *keyLocks
	closed chan struct{}
}

// Open returns a handle on the database in opts.Dir, opening it if no other handle holds it.
// Sharing one database per directory lets a new configuration provision while the old one still
// runs (a Caddy reload) without tripping Badger's directory lock.
func Open(opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, errors.New("store: no directory given")
	}
	switch len(opts.EncryptionKey) {
	case 0, 16, 24, 32:
	default:
		return nil, fmt.Errorf("store: encryption key must be 16, 24 or 32 bytes, got %d", len(opts.EncryptionKey))
	}
	if err := opts.Memory.Check(); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	sh, err := acquire(opts)
	if err != nil {
		return nil, err
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Store{sh: sh, sync: opts.Sync, now: now, locks: sh.locks, closed: make(chan struct{})}, nil
}

// Close releases this handle. It is safe to call more than once.
func (s *Store) Close() error {
	select {
	case <-s.closed:
		return nil
	default:
		close(s.closed)
	}
	return release(s.sh)
}

// Size reports the database's size on disk in bytes.
// Badger's own DB.Size reads counters that exist only with its metrics on, which we leave off:
// the files on disk are the measure.
func (s *Store) Size() int64 {
	entries, err := os.ReadDir(s.sh.dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
	}
	return n
}

// SetSyncObserver has observe called with the number of writes each group fsync covers.
func (s *Store) SetSyncObserver(observe func(writes int)) { s.sh.syncer.observe.Store(&observe) }

// Ping reports whether the database is open and answers a read. It writes nothing: a readiness
// probe is not a write load.
func (s *Store) Ping() error {
	return s.view(func(txn *badger.Txn) error {
		_, err := txn.Get([]byte(keyPing))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		return err
	})
}

// update runs fn in a read-write transaction, retrying on optimistic conflicts, then waits for
// the group commit's fsync when the handle is durable.
func (s *Store) update(fn func(txn *badger.Txn) error) error {
	return s.updateIf(func(txn *badger.Txn) (bool, error) { return true, fn(txn) })
}

// updateThen is update with committed called once the transaction is committed, before the
// fsync is waited for: in-memory state follows what the database holds even when the fsync then
// fails (the store is the truth).
func (s *Store) updateThen(fn func(txn *badger.Txn) error, committed func()) error {
	return s.write(func(txn *badger.Txn) (bool, error) { return true, fn(txn) }, committed, nil)
}

// updateIf is update for a transaction that may decide to write nothing (fn reports whether it
// wrote): then there is nothing to wait an fsync for.
func (s *Store) updateIf(fn func(txn *badger.Txn) (bool, error)) error {
	return s.write(fn, nil, nil)
}

// write runs fn as updateIf does, calls committed as updateThen does, and waits for the fsync
// unless durable, asked once the transaction is committed, says the write need not be durable
// before the call returns (nil: it must). A transaction that wrote nothing, or need not wait,
// still waits for the sync of what it read when that was not yet durable (fresh.go).
func (s *Store) write(fn func(txn *badger.Txn) (bool, error), committed func(), durable func() bool) error {
	wrote, read, err := s.commit(fn, committed)
	if err != nil || !s.sync {
		return err
	}
	mustSync := durable == nil || durable()
	switch {
	case wrote && mustSync:
		return wrap(s.sh.syncer.wait()) // covers what it read too
	case !wrote:
		return wrap(s.awaitDurable(read))
	}
	return nil // a claim that need not be durable runs on what it read (store.ClaimMustBeDurable)
}

// commit runs fn in a read-write transaction, retrying on optimistic conflicts, and calls
// committed once it is committed when fn wrote. It reports whether fn wrote and, under
// durability sync, the newest version it read that no sync had covered yet (fresh.go).
func (s *Store) commit(fn func(txn *badger.Txn) (bool, error), committed func()) (wrote bool, read uint64, err error) {
	if err := s.usable(); err != nil {
		return false, 0, err
	}
	for attempt := 0; ; attempt++ {
		var txn *badger.Txn
		err := s.sh.db.Update(func(t *badger.Txn) error {
			var err error
			txn = t
			if s.sync {
				watch(t, &s.sh.durable.durable)
				defer func() { read = unwatch(t) }()
			}
			wrote, err = fn(t)
			return err
		})
		s.sh.counts.settle(txn, err == nil)
		s.sh.settled.settle(txn, err == nil)
		if errors.Is(err, badger.ErrConflict) && attempt < 64 {
			continue
		}
		if err != nil {
			return false, 0, wrap(err)
		}
		break
	}
	if committed != nil && wrote {
		committed()
	}
	return wrote, read, nil
}

// view runs fn in a read-only transaction. Under durability sync it returns once what fn read
// is durable (fresh.go).
func (s *Store) view(fn func(txn *badger.Txn) error) error {
	if err := s.usable(); err != nil {
		return err
	}
	var read uint64
	err := s.sh.db.View(func(txn *badger.Txn) error {
		if s.sync {
			watch(txn, &s.sh.durable.durable)
			defer func() { read = unwatch(txn) }()
		}
		return fn(txn)
	})
	if err != nil {
		return wrap(err)
	}
	return wrap(s.awaitDurable(read))
}

func (s *Store) usable() error {
	select {
	case <-s.closed:
		return store.ErrClosed
	default:
		return nil
	}
}

// domainError marks errors that are answers, not storage failures (a store.Answer); wrap
// leaves them alone.
type domainError struct{ error }

func (e domainError) Unwrap() error { return e.error }

// StoreAnswer makes domainError a store.Answer.
func (e domainError) StoreAnswer() error { return e.error }

// wrapAnswer marks err, when there is one, as an answer.
func wrapAnswer(err error) error {
	if err == nil {
		return nil
	}
	return domainError{err}
}

// wrap is store.Unavailable: a storage failure wrapped in store.ErrUnavailable, an answer as
// it is.
func wrap(err error) error { return store.Unavailable(err) }

// The Badger Store is a Backend.
var (
	_ store.Backend      = (*Store)(nil)
	_ store.EarlyClaimer = (*Store)(nil)
)

// read runs one of the layout's getters in a read transaction.
func read[K, T any](s *Store, get func(*badger.Txn, K) (T, error), key K) (T, error) {
	var out T
	err := s.view(func(txn *badger.Txn) error {
		var err error
		out, err = get(txn, key)
		return err
	})
	return out, err
}

package badger

import (
	"bytes"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/mulligan-gw/mulligan/store"
)

// shared is one open database and the handles counting on it.
type shared struct {
	dir string
	// through counts the bytes of files written and read through the value logs, which the
	// page-outs follow (resident.go).
	through atomic.Int64
	key     []byte
	db      *badger.DB
	refs    int
	syncer  *groupSyncer
	// durable knows which commits a sync covered (durability.go); reads compare with it.
	durable *durableSync
	locks   *keyLocks
	// opLocks serialise the writes of one operation with their in-memory moves (queue.go), so
	// the moves land in the order of the commits.
	opLocks *keyLocks
	// batchLocks make a batch's writers take turns (batches.go); a line's change takes its
	// batch's after its own operation's, a stripe of another set, so no order can cycle.
	batchLocks *keyLocks
	// scopeLocks make an accept under max_per_scope count and write in one step per scope
	// (operations.go); taken before the operation's own, a stripe of another set: a scope and an
	// operation hashing to one stripe of one set would deadlock (seen in CI).
	scopeLocks *keyLocks
	stopGC     chan struct{}
	gcDone     chan struct{}
	// residentDone closes when keepResident (resident.go) has stopped.
	residentDone chan struct{}

	announcer   announcerSlot
	batchAnn    batchAnnouncerSlot
	settled     settledBatches
	eventLeases eventLeases
	queue       *queueState
	counts      outboxCounts
	deadKeptFor time.Duration // dead-letter retention
}

var (
	poolMu sync.Mutex
	pool   = map[string]*shared{}
)

func acquire(opts Options) (*shared, error) {
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	poolMu.Lock()
	defer poolMu.Unlock()
	if sh, ok := pool[dir]; ok {
		if !bytes.Equal(sh.key, opts.EncryptionKey) {
			return nil, fmt.Errorf("store: %s is already open with a different encryption key", dir)
		}
		sh.refs++
		return sh, nil
	}
	db, err := badger.Open(badgerOptions(dir, opts))
	if err != nil {
		return nil, fmt.Errorf("%w: opening %s: %v", store.ErrUnavailable, dir, err)
	}
	durable := newDurableSync(db, dir)
	// Before anything reads: what a power cut left of writes never synced is rolled back, and
	// what the database holds is made durable (a process killed left its writes in the page
	// cache, which a power cut could still lose).
	if err := rollBackLostWrites(db, durable.sync, opts.Logger); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("%w: checking the writes of %s after its last sync: %v", store.ErrUnavailable, dir, err)
	}
	if err := durable.sync(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("%w: syncing %s: %v", store.ErrUnavailable, dir, err)
	}
	sh := &shared{
		dir: dir, key: bytes.Clone(opts.EncryptionKey), db: db, refs: 1, durable: durable,
		syncer: newGroupSyncer(durable.sync), locks: newKeyLocks(), opLocks: newKeyLocks(), batchLocks: newKeyLocks(), scopeLocks: newKeyLocks(),
		stopGC: make(chan struct{}), gcDone: make(chan struct{}), residentDone: make(chan struct{}),
		queue: newQueueState(), deadKeptFor: opts.DeadLetterRetention,
	}
	if sh.deadKeptFor <= 0 {
		sh.deadKeptFor = store.DefaultDeadLetterRetention
	}
	if err := sh.queue.load(db); err != nil {
		sh.syncer.stop()
		_ = db.Close()
		return nil, fmt.Errorf("%w: reading the queue of %s: %v", store.ErrUnavailable, dir, err)
	}
	if err := sh.counts.load(db); err != nil {
		sh.syncer.stop()
		_ = db.Close()
		return nil, fmt.Errorf("%w: counting the outbox of %s: %v", store.ErrUnavailable, dir, err)
	}
	go sh.collectGarbage()
	go sh.keepResident(opts.pageOutEvery)
	pool[dir] = sh
	return sh, nil
}

// IsOpen reports whether a database is open in dir, for tests and tools that must not touch
// the directory meanwhile.
func IsOpen(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	poolMu.Lock()
	defer poolMu.Unlock()
	_, ok := pool[abs]
	return ok
}

func release(sh *shared) error {
	poolMu.Lock()
	defer poolMu.Unlock()
	sh.refs--
	if sh.refs > 0 {
		return nil
	}
	delete(pool, sh.dir)
	close(sh.stopGC)
	<-sh.gcDone
	<-sh.residentDone
	sh.syncer.stop()
	// Close makes every write durable: the next open checks nothing written before this.
	_ = sh.db.Update(func(txn *badger.Txn) error { return setSynced(txn, committedVersion(sh.db)) })
	return sh.db.Close()
}

// badgerOptions tunes Badger for a sidecar: small memtables and caches keep the resident set
// modest (memory.go), values above 1 KiB go to the value log so the LSM tree stays small.
func badgerOptions(dir string, opts Options) badger.Options {
	mem := opts.Memory.withDefaults()
	o := badger.DefaultOptions(dir).
		WithSyncWrites(false). // durability comes from the group syncer, one sync per batch (durability.go)
		WithMemTableSize(mem.MemTableSize).
		WithNumMemtables(mem.MemTables).
		WithBlockCacheSize(mem.BlockCache).
		WithIndexCacheSize(mem.IndexCache).
		WithValueThreshold(1 << 10).
		WithValueLogFileSize(mem.ValueLogFileSize).
		WithNumCompactors(2).
		WithNumGoroutines(2).
		WithMetricsEnabled(true).      // the value log's byte count spares syncs of an unchanged log (durability.go)
		WithVerifyValueChecksum(true). // a value-log page a power cut left unwritten reads as an error (recovery.go)
		WithLogger(logAdapter{opts.Logger})
	// Every table below level 0 is BaseTableSize (2 MB), however deep the tree grows: a
	// compaction builds several tables in memory at once, each in a buffer of twice its size, so
	// tables that double with each level would make its memory grow with the database.
	o.TableSizeMultiplier = 1
	if len(opts.EncryptionKey) > 0 {
		o = o.WithEncryptionKey(opts.EncryptionKey)
	}
	return o
}

// collectGarbage deletes dead letters past their retention and reclaims value-log space left by
// expired and deleted records.
func (sh *shared) collectGarbage() {
	defer close(sh.gcDone)
	t := time.NewTicker(5 * time.Minute)
	defer t.Stop()
	for {
		select {
		case <-sh.stopGC:
			return
		case <-t.C:
			_, _ = sh.expireDeadLetters(time.Now().Add(-sh.deadKeptFor)) // tried again next tick
			sh.collectValueLogs()
		}
	}
}

// collectValueLogs runs Badger's value-log GC. The GC moves the live values of a log into the
// newest one, then deletes the old log; it syncs neither, so a crash between could lose values
// whose only copy on disk was the deleted log. Badger defers deleting a log while an iterator is
// open: one is held through the GC, and released only once a sync made the moves durable.
func (sh *shared) collectValueLogs() {
	txn := sh.db.NewTransaction(false)
	it := txn.NewIterator(badger.IteratorOptions{})
	defer func() {
		_ = sh.syncer.wait() // a failed sync fails the writers waiting on it too
		it.Close()           // the logs the GC emptied are deleted now
		txn.Discard()
	}()
	for sh.db.RunValueLogGC(0.5) == nil {
	}
}

// logAdapter forwards Badger's warnings and errors and drops its chatter.
type logAdapter struct{ l store.Logger }

func (a logAdapter) Errorf(f string, v ...any) {
	if a.l != nil {
		a.l.Errorf(f, v...)
	}
}
func (a logAdapter) Warningf(f string, v ...any) {
	if a.l != nil {
		a.l.Warningf(f, v...)
	}
}
func (logAdapter) Infof(string, ...any)  {}
func (logAdapter) Debugf(string, ...any) {}

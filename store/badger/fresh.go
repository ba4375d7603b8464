package badger

import (
	"sync"
	"sync/atomic"

	badger "github.com/dgraph-io/badger/v4"
)

// Reads see only durable state (docs/backends.md). Badger makes a commit visible as soon as it
// is applied, and under durability sync its writer then waits for the group syncer's fsync:
// meanwhile another reader could hand out a final status, a result, an event or a replay that a
// power cut would still take back. So a read notes the newest version it read that no sync has
// covered yet (durableSync.durable), and before it returns waits for the sync that covers it.
// A read of data older than the last sync, as nearly every replay is, costs one comparison; a
// transaction that starts with nothing newer than the last sync to see costs nothing more.

// fresh maps a transaction that may see writes no sync covered yet to what it read of them.
var fresh sync.Map // *badger.Txn -> *freshRead

type freshRead struct {
	durable *atomic.Uint64
	newest  uint64 // the newest version read that was not durable when read; 0: none
}

// watch starts noting what txn reads that is newer than durable, when it can see any.
func watch(txn *badger.Txn, durable *atomic.Uint64) {
	if txn.ReadTs() > durable.Load() {
		fresh.Store(txn, &freshRead{durable: durable})
	}
}

// unwatch stops noting for txn and returns the newest version it read that was not durable.
func unwatch(txn *badger.Txn) uint64 {
	if v, ok := fresh.LoadAndDelete(txn); ok {
		return v.(*freshRead).newest
	}
	return 0
}

// noteRead records that item was read in txn: what a caller is told of depends on it.
func noteRead(txn *badger.Txn, item *badger.Item) {
	v, ok := fresh.Load(txn)
	if !ok {
		return
	}
	r := v.(*freshRead) // a transaction runs on one goroutine
	if version := item.Version(); version > r.newest && version > r.durable.Load() {
		r.newest = version
	}
}

// awaitDurable returns once a sync covered version (at once when one already did).
func (s *Store) awaitDurable(version uint64) error {
	for version > s.sh.durable.durable.Load() {
		if err := s.sh.syncer.wait(); err != nil {
			return err
		}
	}
	return nil
}

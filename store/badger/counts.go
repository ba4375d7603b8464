package badger

import (
	"sync"
	"sync/atomic"

	badger "github.com/dgraph-io/badger/v4"
)

// outboxCounts keeps the number of pending and dead-lettered events as they change, so that
// CountEvents (read by every metrics scrape) walks nothing. The database is counted once when
// it opens; after that each transaction's changes are held aside and applied when, and only
// when, it commits.
type outboxCounts struct {
	pending, dead atomic.Int64
	open          sync.Map // *badger.Txn -> *[2]int64, changes of transactions not yet committed
}

// load counts the outbox of a database nobody writes to yet.
func (c *outboxCounts) load(db *badger.DB) error {
	return db.View(func(txn *badger.Txn) error {
		c.pending.Store(int64(countPrefix(txn, prefixPending)))
		c.dead.Store(int64(countPrefix(txn, prefixDead)))
		return nil
	})
}

// add holds a change of the counts made in txn until txn ends.
func (c *outboxCounts) add(txn *badger.Txn, pending, dead int64) {
	if pending == 0 && dead == 0 {
		return
	}
	v, _ := c.open.LoadOrStore(txn, new([2]int64))
	d := v.(*[2]int64) // a transaction runs on one goroutine
	d[0] += pending
	d[1] += dead
}

// settle applies txn's changes if it committed and forgets them either way.
func (c *outboxCounts) settle(txn *badger.Txn, committed bool) {
	if txn == nil {
		return
	}
	v, ok := c.open.LoadAndDelete(txn)
	if !ok || !committed {
		return
	}
	d := v.(*[2]int64)
	c.pending.Add(d[0])
	c.dead.Add(d[1])
}

func (c *outboxCounts) read() (pending, dead int64) {
	return c.pending.Load(), c.dead.Load()
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

package badger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/mulligan-gw/mulligan/store"
)

// What a power cut leaves. Badger writes a value above ValueThreshold to the value log and a
// pointer to it in the WAL; the kernel writes their pages back in no order, so a power cut can
// leave a WAL entry whose value never reached the disk. Every write a caller was told of was
// synced, the value log before the WAL (durability.go), so such an entry belongs to a write no
// caller was told of: one after the last sync. Badger replays it all the same, and its value
// then reads as an error (or, zeroed, fails its checksum). At open the store finds the first
// such write and rolls back it and every write after it (all unacknowledged, being later), so
// the database holds exactly what it held before them: never a record no read can decode, and
// never half a transaction (an operation final without its result, an index without its entry).

// setSynced records, in txn, that every commit at or below version is on disk.
func setSynced(txn *badger.Txn, version uint64) error {
	return txn.Set([]byte(keySynced), binary.BigEndian.AppendUint64(nil, version))
}

// syncedVersion reads what setSynced last wrote (0 when never: then everything is checked).
func syncedVersion(db *badger.DB) (uint64, error) {
	var v uint64
	err := db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte(keySynced))
		if err == badger.ErrKeyNotFound {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(b []byte) error {
			if len(b) == 8 {
				v = binary.BigEndian.Uint64(b)
			}
			return nil
		})
	})
	return v, err
}

// rollBackLostWrites finds, among the writes after the last recorded sync, the first whose
// value cannot be read, and rolls the database back to its state before it; sync then makes
// the rollback durable. It logs what it rolled back.
func rollBackLostWrites(db *badger.DB, sync func() error, log store.Logger) error {
	since, err := syncedVersion(db)
	if err != nil {
		return err
	}
	lost, first, err := firstLostWrite(db, since)
	if err != nil || lost == 0 {
		return err
	}
	keys, err := writtenSince(db, lost)
	if err != nil {
		return err
	}
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	if err := db.View(func(txn *badger.Txn) error {
		for _, k := range keys {
			if err := restore(txn, wb, k, lost); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := wb.Flush(); err != nil {
		return err
	}
	if err := sync(); err != nil {
		return err
	}
	if log != nil {
		log.Warningf("store: %d records written after the last sync were rolled back: a value of theirs never reached the disk (a power cut before their sync; none was acknowledged). First unreadable: %s: %v. Rolled back: %s",
			len(keys), describeKey(first.key), first.err, describeKeys(keys))
	}
	return nil
}

type unreadable struct {
	key []byte
	err error
}

// firstLostWrite returns the oldest commit version after since whose value (the newest of its
// key) cannot be read, 0 when every one reads. Older versions of a key are left alone: the
// value-log GC may have dropped them, as it may.
func firstLostWrite(db *badger.DB, since uint64) (uint64, unreadable, error) {
	var lost uint64
	var first unreadable
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{SinceTs: since})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			if lost != 0 && item.Version() >= lost {
				continue
			}
			if err := readable(item); err != nil {
				lost, first = item.Version(), unreadable{item.KeyCopy(nil), err}
			}
		}
		return nil
	})
	return lost, first, err
}

// errUnreadable is a value Badger could not read from the value log: it logs the failure and
// hands out an empty value instead.
var errUnreadable = errors.New("its value cannot be read from the value log")

// readable reports whether item's value reads back. A value in the value log is never empty
// (it is there for being above ValueThreshold), so an empty one read for it is one that failed.
func readable(item *badger.Item) error {
	return item.Value(func(v []byte) error {
		if len(v) == 0 && item.ValueSize() > 0 {
			return errUnreadable
		}
		return nil
	})
}

// writtenSince lists the keys whose newest version is at or after version, deleted ones too.
func writtenSince(db *badger.DB, version uint64) ([][]byte, error) {
	var keys [][]byte
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{SinceTs: version - 1, AllVersions: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(keys) == 0 || !bytes.Equal(keys[len(keys)-1], k) {
				keys = append(keys, it.Item().KeyCopy(nil))
			}
		}
		return nil
	})
	return keys, err
}

// restore writes key back as its newest version before version was (deleted when there was
// none, or it was deleted or expired).
func restore(txn *badger.Txn, wb *badger.WriteBatch, key []byte, version uint64) error {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: key, AllVersions: true})
	defer it.Close()
	for it.Seek(key); it.Valid() && bytes.Equal(it.Item().Key(), key); it.Next() {
		item := it.Item()
		if item.Version() >= version {
			continue
		}
		if item.IsDeletedOrExpired() {
			break
		}
		if readable(item) != nil {
			break // unreadable too: gone with the rest
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		e := badger.NewEntry(key, v).WithMeta(item.UserMeta())
		e.ExpiresAt = item.ExpiresAt()
		return wb.SetEntry(e)
	}
	return wb.Delete(key)
}

// describeKey names a key for the log by its family and what follows (ids; idempotency keys and
// scopes are hashes already).
func describeKey(k []byte) string {
	if i := bytes.IndexByte(k, '/'); i > 0 && i+1 < len(k) {
		rest := k[i+1:]
		if string(k[:i+1]) == prefixIdempotency || bytes.ContainsFunc(rest, func(r rune) bool { return r < ' ' || r > '~' }) {
			return fmt.Sprintf("%s%x", k[:i+1], rest)
		}
	}
	return fmt.Sprintf("%q", k)
}

func describeKeys(keys [][]byte) string {
	const most = 20
	var b strings.Builder
	for i, k := range keys {
		if i == most {
			fmt.Fprintf(&b, " and %d more", len(keys)-most)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(describeKey(k))
	}
	return b.String()
}

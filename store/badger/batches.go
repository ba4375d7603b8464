package badger

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/mulligan-gw/mulligan/store"
)

// The Badger side of files and batches (docs/batches.md). Key layout, beside keys.go's:
//
//	f/<file id>                  -> file
//	c/<file id>/<seq, 8 bytes>   -> a chunk of its content
//	g/<scope>/<file id>          -> (empty) the scope's files
//	b/<batch id>                 -> batch
//	h/<scope>/<batch id>         -> (empty) the scope's batches
//	w/<batch id>                 -> (empty) batches not final: the batch worker's list
const (
	prefixFile       = "f/"
	prefixFileChunk  = "c/"
	prefixFileScope  = "g/"
	prefixBatch      = "b/"
	prefixBatchScope = "h/"
	prefixUnsettled  = "w/"
)

// fileChunk is the size of one stored piece of a file: small enough for one transaction,
// large enough that a 200 MiB file is a few hundred writes.
const fileChunk = 1 << 20

func fileKey(id string) []byte             { return []byte(prefixFile + id) }
func fileChunkPrefix(id string) []byte     { return []byte(prefixFileChunk + id + "/") }
func fileScopeKey(scope, id string) []byte { return []byte(prefixFileScope + scope + "/" + id) }
func batchKey(id string) []byte            { return []byte(prefixBatch + id) }
func batchScopeKey(scope, id string) []byte {
	return []byte(prefixBatchScope + scope + "/" + id)
}
func fileChunkKey(id string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(fileChunkPrefix(id), seq)
}

// batchAnnouncerSlot holds what the module installs for batches: the announcer of their final
// statuses and the sizer of their lines.
type batchAnnouncerSlot struct {
	ann   atomic.Pointer[store.BatchAnnouncer]
	sizer atomic.Pointer[store.BatchLineSizer]
}

// SetBatchAnnouncer installs the announcer of batches' final statuses.
func (s *Store) SetBatchAnnouncer(a store.BatchAnnouncer) { s.sh.batchAnn.ann.Store(&a) }

// SetBatchLineSizer installs the sizer of batches' lines.
func (s *Store) SetBatchLineSizer(z store.BatchLineSizer) { s.sh.batchAnn.sizer.Store(&z) }

// SetBatchSettled installs, for every handle on this database, the function told of each batch
// a transaction made final once it has committed (see store.Batches).
func (s *Store) SetBatchSettled(fn func(*store.Batch)) { s.sh.settled.fn.Store(&fn) }

// settledBatches holds the batches each open transaction made final until it ends, as
// outboxCounts holds its counts: only a committed transaction's are told.
type settledBatches struct {
	fn   atomic.Pointer[func(*store.Batch)]
	open sync.Map // *badger.Txn -> *[]*store.Batch
}

// add holds b, made final in txn.
func (sb *settledBatches) add(txn *badger.Txn, b *store.Batch) {
	v, _ := sb.open.LoadOrStore(txn, new([]*store.Batch))
	l := v.(*[]*store.Batch) // a transaction runs on one goroutine
	cp := *b
	*l = append(*l, &cp)
}

// settle tells txn's batches if it committed and forgets them either way.
func (sb *settledBatches) settle(txn *badger.Txn, committed bool) {
	if txn == nil {
		return
	}
	v, ok := sb.open.LoadAndDelete(txn)
	fn := sb.fn.Load()
	if !ok || !committed || fn == nil || *fn == nil {
		return
	}
	for _, b := range *v.(*[]*store.Batch) {
		(*fn)(b)
	}
}

// CreateFile stores f and its content in chunks of their own transactions; the file itself is
// written last, so a file half uploaded when the process died is never visible (its chunks
// expire with the file's lifetime). The scope's index entry is written first and holds the
// bytes stored so far: the scope's quota counts uploads in progress, each chunk checked and
// written under the scope's file lock (store.FileQuotaRoom).
func (s *Store) CreateFile(f *store.File, r io.Reader, lim store.FileLimits) error {
	ttl := time.Until(f.ExpiresAt)
	if err := s.reserveFile(f, lim, 0, ttl); err != nil {
		return err
	}
	buf := make([]byte, fileChunk)
	var seq uint64
	lastByte := byte('\n')
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			f.Lines += bytes.Count(buf[:n], []byte{'\n'})
			if f.Bytes+int64(n) > lim.MaxBytes && lim.MaxBytes > 0 {
				s.dropUpload(f)
				return store.ErrTooLarge
			}
			lastByte = buf[n-1]
			if werr := s.putChunk(f, seq, buf[:n], lim, ttl); werr != nil {
				s.dropUpload(f)
				return werr
			}
			s.sh.through.Add(int64(n))
			seq++
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			s.dropUpload(f)
			return err
		}
	}
	if lastByte != '\n' {
		f.Lines++ // a last line without its newline
	}
	return s.update(func(txn *badger.Txn) error {
		v, err := store.Encode(f, nil)
		if err != nil {
			return err
		}
		return txn.SetEntry(badger.NewEntry(fileKey(f.ID), v).WithTTL(ttl))
	})
}

// reserveFile writes f's scope index entry with its bytes so far, n more, once the scope's
// quota has room for them: the first call (f.Bytes and n zero) takes a place among the scope's
// files.
func (s *Store) reserveFile(f *store.File, lim store.FileLimits, n int64, ttl time.Duration) error {
	return s.underFileQuota(f, lim, n, func(txn *badger.Txn) error {
		v := binary.BigEndian.AppendUint64(nil, uint64(f.Bytes+n))
		return txn.SetEntry(badger.NewEntry(fileScopeKey(f.Scope, f.ID), v).WithTTL(ttl))
	})
}

// putChunk stores chunk seq of f with the bytes it adds to f's reservation, in one transaction.
func (s *Store) putChunk(f *store.File, seq uint64, data []byte, lim store.FileLimits, ttl time.Duration) error {
	n := int64(len(data))
	err := s.underFileQuota(f, lim, n, func(txn *badger.Txn) error {
		if err := txn.SetEntry(badger.NewEntry(fileChunkKey(f.ID, seq), data).WithTTL(ttl)); err != nil {
			return err
		}
		v := binary.BigEndian.AppendUint64(nil, uint64(f.Bytes+n))
		return txn.SetEntry(badger.NewEntry(fileScopeKey(f.Scope, f.ID), v).WithTTL(ttl))
	})
	if err == nil {
		f.Bytes += n
	}
	return err
}

// underFileQuota runs write in a transaction if f's scope has room for n more bytes of f (and,
// when f is not reserved yet, for one more file). The scope's uploads take turns on a lock of
// their own, so the count read is the count written against.
func (s *Store) underFileQuota(f *store.File, lim store.FileLimits, n int64, write func(*badger.Txn) error) error {
	unlock := s.sh.scopeLocks.lock([]byte(prefixFileScope + f.Scope))
	defer unlock()
	return s.update(func(txn *badger.Txn) error {
		files, used, mine, err := scopeFiles(txn, f.Scope, f.ID)
		if err != nil {
			return err
		}
		if err := store.FileQuotaRoom(lim, files, used, n, !mine); err != nil {
			return domainError{err}
		}
		return write(txn)
	})
}

// scopeFiles counts scope's files not expired (uploads in progress included) and their bytes,
// and reports whether id is among them. An index entry written before the entries held sizes
// is sized by its file.
func scopeFiles(txn *badger.Txn, scope, id string) (files int, used int64, mine bool, err error) {
	prefix := []byte(prefixFileScope + scope + "/")
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 100})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		fid := string(item.Key()[len(prefix):])
		mine = mine || fid == id
		files++
		v, err := item.ValueCopy(nil)
		if err != nil {
			return 0, 0, false, err
		}
		if len(v) == 8 {
			used += int64(binary.BigEndian.Uint64(v))
			continue
		}
		var f store.File
		err = getValue(txn, fileKey(fid), func(v []byte) error { _, err := store.Decode(v, &f); return err })
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return 0, 0, false, err
		}
		used += f.Bytes
	}
	return files, used, mine, nil
}

// dropUpload deletes a refused or broken upload: its scope index entry, then its chunks.
func (s *Store) dropUpload(f *store.File) {
	if s.update(func(txn *badger.Txn) error { return txn.Delete(fileScopeKey(f.Scope, f.ID)) }) == nil {
		s.dropChunks(f.ID)
	}
}

// dropChunks deletes file id's chunks, a transaction per few hundred.
func (s *Store) dropChunks(id string) {
	for {
		var keys [][]byte
		_ = s.view(func(txn *badger.Txn) error {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: fileChunkPrefix(id)})
			defer it.Close()
			for it.Rewind(); it.Valid() && len(keys) < 256; it.Next() {
				keys = append(keys, it.Item().KeyCopy(nil))
			}
			return nil
		})
		if len(keys) == 0 {
			return
		}
		if s.update(func(txn *badger.Txn) error {
			for _, k := range keys {
				if err := txn.Delete(k); err != nil {
					return err
				}
			}
			return nil
		}) != nil {
			return
		}
	}
}

// GetFile returns file id, or store.ErrNotFound.
func (s *Store) GetFile(id string) (*store.File, error) {
	var f store.File
	err := s.view(func(txn *badger.Txn) error {
		return getValue(txn, fileKey(id), func(v []byte) error { _, err := store.Decode(v, &f); return err })
	})
	if err != nil {
		return nil, err
	}
	return &f, nil
}

// OpenFile streams file id's content, one chunk read at a time.
func (s *Store) OpenFile(id string) (io.ReadCloser, error) {
	if _, err := s.GetFile(id); err != nil {
		return nil, err
	}
	return io.NopCloser(bufio.NewReaderSize(&store.ChunkReader{Chunk: func(seq int) ([]byte, bool, error) { return s.chunk(id, seq) }}, 64<<10)), nil
}

// chunk returns chunk seq of file id, or false after its last one (a store.ChunkReader's Chunk).
func (s *Store) chunk(id string, seq int) ([]byte, bool, error) {
	var data []byte
	err := s.view(func(txn *badger.Txn) error {
		return getValue(txn, fileChunkKey(id, uint64(seq)), func(v []byte) error {
			data = append([]byte(nil), v...)
			return nil
		})
	})
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, nil
	}
	s.sh.through.Add(int64(len(data)))
	return data, err == nil, err
}

// DeleteFile removes file id and its content.
func (s *Store) DeleteFile(id string) error {
	f, err := s.GetFile(id)
	if err != nil {
		return err
	}
	if err := s.update(func(txn *badger.Txn) error {
		if err := txn.Delete(fileKey(id)); err != nil {
			return err
		}
		return txn.Delete(fileScopeKey(f.Scope, id))
	}); err != nil {
		return err
	}
	s.dropChunks(id)
	return nil
}

// ListFiles returns scope's files newest first (see store.Batches).
func (s *Store) ListFiles(scope, after string, limit int) ([]*store.File, bool, error) {
	var out []*store.File
	more, err := s.listIndex([]byte(prefixFileScope+scope+"/"), after, limit, func(txn *badger.Txn, id string) (bool, error) {
		var f store.File
		err := getValue(txn, fileKey(id), func(v []byte) error { _, err := store.Decode(v, &f); return err })
		if errors.Is(err, store.ErrNotFound) {
			return false, nil
		}
		out = append(out, &f)
		return err == nil, err
	})
	return out, more, err
}

// ListBatches returns scope's batches newest first (see store.Batches).
func (s *Store) ListBatches(scope, after string, limit int) ([]*store.Batch, bool, error) {
	var out []*store.Batch
	more, err := s.listIndex([]byte(prefixBatchScope+scope+"/"), after, limit, func(txn *badger.Txn, id string) (bool, error) {
		b, err := getBatch(txn, id)
		if errors.Is(err, store.ErrNotFound) {
			return false, nil
		}
		out = append(out, b)
		return err == nil, err
	})
	return out, more, err
}

// listIndex walks an index whose keys end in ids newest first, after `after`, calling add
// until it has taken limit; it reports whether more follow.
func (s *Store) listIndex(prefix []byte, after string, limit int, add func(*badger.Txn, string) (bool, error)) (bool, error) {
	more := false
	err := s.view(func(txn *badger.Txn) error {
		it := newestFirst(txn, prefix, after)
		defer it.Close()
		taken := 0
		for ; it.Valid(); it.Next() {
			id := string(it.Item().Key()[len(prefix):])
			if id == after {
				continue
			}
			if taken == limit {
				more = true
				return nil
			}
			ok, err := add(txn, id)
			if err != nil {
				return err
			}
			if ok {
				taken++
			}
		}
		return nil
	})
	return more, err
}

// CreateBatch stores a new batch.
func (s *Store) CreateBatch(b *store.Batch) error {
	return s.update(func(txn *badger.Txn) error {
		if err := txn.Set(batchScopeKey(b.Scope, b.ID), nil); err != nil {
			return err
		}
		return s.putBatch(txn, b)
	})
}

// GetBatch returns batch id, or store.ErrNotFound.
func (s *Store) GetBatch(id string) (*store.Batch, error) {
	return read(s, getBatch, id)
}

func getBatch(txn *badger.Txn, id string) (*store.Batch, error) {
	var b store.Batch
	err := getValue(txn, batchKey(id), func(v []byte) error { _, err := store.Decode(v, &b); return err })
	if err != nil {
		return nil, err
	}
	return &b, nil
}

// putBatch writes b, keeps the unsettled index in step, gives a final batch its retention and
// writes the announcer's event for it.
func (s *Store) putBatch(txn *badger.Txn, b *store.Batch) error {
	v, err := store.Encode(b, nil)
	if err != nil {
		return err
	}
	if !b.Status.Final() {
		if err := txn.Set([]byte(prefixUnsettled+b.ID), nil); err != nil {
			return err
		}
		return txn.Set(batchKey(b.ID), v)
	}
	if err := txn.Delete([]byte(prefixUnsettled + b.ID)); err != nil {
		return err
	}
	ttl := time.Until(b.PurgeAt())
	if err := txn.SetEntry(badger.NewEntry(batchKey(b.ID), v).WithTTL(ttl)); err != nil {
		return err
	}
	if err := txn.SetEntry(badger.NewEntry(batchScopeKey(b.Scope, b.ID), nil).WithTTL(ttl)); err != nil {
		return err
	}
	s.sh.settled.add(txn, b)
	return s.announceBatch(txn, b)
}

func (s *Store) announceBatch(txn *badger.Txn, b *store.Batch) error {
	ev := store.PendingBatchEvent(s.sh.batchAnn.ann.Load(), b)
	if ev == nil {
		return nil
	}
	return s.sh.putEvent(txn, ev, nil)
}

// UpdateBatch applies fn to batch id and settles it (see store.Batches). A final batch is returned
// as it is, fn not called.
func (s *Store) UpdateBatch(id string, fn func(*store.Batch) error) (*store.Batch, error) {
	unlock := s.sh.batchLocks.lock([]byte(id)) // the batch's writers take turns (see change)
	defer unlock()
	var out *store.Batch
	err := s.update(func(txn *badger.Txn) error {
		b, err := getBatch(txn, id)
		if err != nil {
			return err
		}
		out = b
		changed, err := store.UpdateBatchWith(b, s.now(), fn)
		if err != nil || !changed {
			return wrapAnswer(err)
		}
		return s.putBatch(txn, b)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AddBatchLines stores lines from+1.. of batch id (see store.Batches).
func (s *Store) AddBatchLines(id string, from int, ops []*store.Operation, reqs []*store.Request) (*store.Batch, error) {
	unlock := s.sh.batchLocks.lock([]byte(id))
	defer unlock()
	var out *store.Batch
	err := s.updateThen(func(txn *badger.Txn) error {
		b, err := getBatch(txn, id)
		if err != nil {
			return err
		}
		if b.Created != from || b.Status.Final() {
			return domainError{store.ErrStale}
		}
		at := s.now()
		for i, op := range ops {
			if store.CutLine(b, op, at) || op.Status.Final() {
				store.CountLine(b, op, nil, s.sh.batchAnn.sizer.Load())
			} else if err := putRequest(txn, op.ID, reqs[i]); err != nil {
				return err
			}
			if err := putOperation(txn, op, nil); err != nil {
				return err
			}
		}
		b.Created += len(ops)
		b.UpdatedAt = at
		store.SettleBatch(b, at)
		out = b
		return s.putBatch(txn, b)
	}, func() {
		for _, op := range ops {
			s.sh.queue.moved(op, "")
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// countLine counts a line operation that has just become final into its batch, in the same
// transaction: a line is counted exactly once, and the last one settles the batch.
func (s *Store) countLine(txn *badger.Txn, op *store.Operation, res *store.Response, at time.Time) error {
	if op.Batch == nil || !op.Status.Final() {
		return nil
	}
	b, err := getBatch(txn, op.Batch.Batch)
	if errors.Is(err, store.ErrNotFound) {
		return nil // the batch is gone (retention): nothing to count into
	}
	if err != nil {
		return err
	}
	if b.Status.Final() {
		return nil
	}
	store.CountLine(b, op, res, s.sh.batchAnn.sizer.Load())
	b.UpdatedAt = at
	store.SettleBatch(b, at)
	return s.putBatch(txn, b)
}

// UnsettledBatches returns the ids of batches not final, oldest first.
func (s *Store) UnsettledBatches() ([]string, error) {
	var ids []string
	err := s.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefixUnsettled)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			ids = append(ids, string(it.Item().Key()[len(prefixUnsettled):]))
		}
		return nil
	})
	return ids, err
}

// The Badger Store keeps files and batches.
var _ store.Batches = (*Store)(nil)

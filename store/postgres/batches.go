package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
)

// Files and batches on PostgreSQL (docs/batches.md): a file is a row and chunk rows; a batch is
// a row whose document the line transitions update under its row lock.

// fileChunk is the size of one chunk row.
const fileChunk = 1 << 20

// batchAnnouncerSlot holds what the module installs for batches: the announcer of their final
// statuses and the sizer of their lines.
type batchAnnouncerSlot struct {
	ann   atomic.Pointer[store.BatchAnnouncer]
	sizer atomic.Pointer[store.BatchLineSizer]
}

// SetBatchAnnouncer installs the announcer of batches' final statuses.
func (s *Store) SetBatchAnnouncer(a store.BatchAnnouncer) { s.batchAnn.ann.Store(&a) }

// SetBatchLineSizer installs the sizer of batches' lines.
func (s *Store) SetBatchLineSizer(z store.BatchLineSizer) { s.batchAnn.sizer.Store(&z) }

// SetBatchSettled installs the function told of each batch this handle's transactions made
// final, once each has committed (see store.Batches): the row lock that settles a batch is
// taken by one transaction of one replica, so one replica tells it.
func (s *Store) SetBatchSettled(fn func(*store.Batch)) { s.settled.Store(&fn) }

// settledKey holds, in a transaction's context, the batches it made final (do tells them once
// it has committed).
type settledKey struct{}

// holdSettled notes in ctx's transaction that it made b final.
func holdSettled(ctx context.Context, b *store.Batch) {
	if l, ok := ctx.Value(settledKey{}).(*[]*store.Batch); ok {
		cp := *b
		*l = append(*l, &cp)
	}
}

// tellSettled tells the installed function of the batches a committed transaction settled.
func (s *Store) tellSettled(settled []*store.Batch) {
	fn := s.settled.Load()
	if fn == nil || *fn == nil {
		return
	}
	for _, b := range settled {
		(*fn)(b)
	}
}

// CreateFile stores f's row, then its chunks, each in a transaction of its own, then marks it
// complete (see store.Batches). The row, written first, takes the file's place in its scope's
// quota, and each chunk adds its bytes to the row's, in the transaction that checks the quota
// (fileQuotaRoom).
func (s *Store) CreateFile(f *store.File, r io.Reader, lim store.FileLimits) error {
	doc, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		if err := fileQuotaRoom(ctx, tx, f.Scope, lim, 0, true, s.now()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO files (id, scope, complete, expires_at, doc) VALUES ($1, $2, false, $3, $4)`,
			f.ID, f.Scope, f.ExpiresAt, doc)
		return err
	}); err != nil {
		return err
	}
	buf := make([]byte, fileChunk)
	lastByte := byte('\n')
	for seq := 0; ; seq++ {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			f.Lines += bytes.Count(buf[:n], []byte{'\n'})
			lastByte = buf[n-1]
			if lim.MaxBytes > 0 && f.Bytes+int64(n) > lim.MaxBytes {
				_ = s.DeleteFile(f.ID)
				return store.ErrTooLarge
			}
			if werr := s.putChunk(f, seq, buf[:n], lim); werr != nil {
				_ = s.DeleteFile(f.ID)
				return werr
			}
			f.Bytes += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			_ = s.DeleteFile(f.ID)
			return err
		}
	}
	if lastByte != '\n' {
		f.Lines++
	}
	return s.completeFile(f)
}

// putChunk stores chunk seq of f and adds its bytes to f's row, if f's scope has room for them.
func (s *Store) putChunk(f *store.File, seq int, chunk []byte, lim store.FileLimits) error {
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		if err := fileQuotaRoom(ctx, tx, f.Scope, lim, int64(len(chunk)), false, s.now()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO file_chunks (file_id, seq, data) VALUES ($1, $2, $3)`, f.ID, seq, chunk); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE files SET bytes = bytes + $2 WHERE id = $1`, f.ID, len(chunk))
		return err
	})
}

// fileQuotaRoom refuses, with store.ErrFileQuota, n more bytes (and, adding, one more file) in
// scope over lim (store.FileQuotaRoom). The scope's uploads, on every replica, are serialised
// by a transaction-scoped advisory lock on the scope taken before the sum, as accepts under
// max_per_scope are (scopeHasRoom): the sum's snapshot then holds every chunk committed before,
// and the next upload's check waits for this one's write.
func fileQuotaRoom(ctx context.Context, tx pgx.Tx, scope string, lim store.FileLimits, n int64, adding bool, now time.Time) error {
	if lim.ScopeBytes <= 0 && lim.ScopeFiles <= 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('mulligan files ' || $1, 0))`, scope); err != nil {
		return err
	}
	var files int
	var used int64
	if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(bytes), 0) FROM files WHERE scope = $1 AND expires_at > $2`,
		scope, now).Scan(&files, &used); err != nil {
		return err
	}
	if err := store.FileQuotaRoom(lim, files, used, n, adding); err != nil {
		return domain{err}
	}
	return nil
}

// completeFile writes f's document and marks its row complete: from then on it is listed.
func (s *Store) completeFile(f *store.File) error {
	doc, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE files SET complete = true, bytes = $2, doc = $3 WHERE id = $1`, f.ID, f.Bytes, doc)
		return err
	})
}

// GetFile returns file id, or ErrNotFound.
func (s *Store) GetFile(id string) (*store.File, error) {
	if !storable(id) {
		return nil, domain{store.ErrNotFound}
	}
	var f *store.File
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		var doc []byte
		err := tx.QueryRow(ctx, `SELECT doc FROM files WHERE id = $1 AND complete AND expires_at > $2`, id, s.now()).Scan(&doc)
		if errors.Is(err, pgx.ErrNoRows) {
			return domain{store.ErrNotFound}
		}
		if err != nil {
			return err
		}
		f = new(store.File)
		return json.Unmarshal(doc, f)
	})
	return f, err
}

// OpenFile streams file id's content, a chunk row at a time.
func (s *Store) OpenFile(id string) (io.ReadCloser, error) {
	if _, err := s.GetFile(id); err != nil {
		return nil, err
	}
	return io.NopCloser(&store.ChunkReader{Chunk: func(seq int) ([]byte, bool, error) { return s.chunk(id, seq) }}), nil
}

// chunk returns chunk seq of file id, or false after its last one (a store.ChunkReader's Chunk).
func (s *Store) chunk(id string, seq int) ([]byte, bool, error) {
	var data []byte
	found := true
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT data FROM file_chunks WHERE file_id = $1 AND seq = $2`, id, seq).Scan(&data)
		if errors.Is(err, pgx.ErrNoRows) {
			found, err = false, nil
		}
		return err
	})
	return data, found && err == nil, err
}

// DeleteFile removes file id; its chunks go with it.
func (s *Store) DeleteFile(id string) error {
	if !storable(id) {
		return domain{store.ErrNotFound}
	}
	return s.do(func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM files WHERE id = $1`, id)
		if err == nil && tag.RowsAffected() == 0 {
			return domain{store.ErrNotFound}
		}
		return err
	})
}

// ListFiles returns scope's files newest first (see store.Batches).
func (s *Store) ListFiles(scope, after string, limit int) ([]*store.File, bool, error) {
	var out []*store.File
	more, err := s.listDocs(`SELECT id, doc FROM files WHERE scope = $1 AND complete AND expires_at > $4 AND ($2 = '' OR id < $2)
		ORDER BY id DESC LIMIT $3`, scope, after, limit, func(doc []byte) error {
		f := new(store.File)
		out = append(out, f)
		return json.Unmarshal(doc, f)
	})
	return out, more, err
}

// ListBatches returns scope's batches newest first (see store.Batches).
func (s *Store) ListBatches(scope, after string, limit int) ([]*store.Batch, bool, error) {
	var out []*store.Batch
	more, err := s.listDocs(`SELECT id, doc FROM batches WHERE scope = $1 AND (purge_at IS NULL OR purge_at > $4)
		AND ($2 = '' OR id < $2) ORDER BY id DESC LIMIT $3`, scope, after, limit, func(doc []byte) error {
		b := new(store.Batch)
		out = append(out, b)
		return json.Unmarshal(doc, b)
	})
	return out, more, err
}

// listDocs runs a list query for limit+1 rows, giving add the first limit documents; it
// reports whether there were more.
func (s *Store) listDocs(sql, scope, after string, limit int, add func([]byte) error) (bool, error) {
	if !storable(after) {
		return false, nil
	}
	more := false
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sql, scope, after, limit+1, s.now())
		if err != nil {
			return err
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			var id string
			var doc []byte
			if err := rows.Scan(&id, &doc); err != nil {
				return err
			}
			if n++; n > limit {
				more = true
				break
			}
			if err := add(doc); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	return more, err
}

// CreateBatch stores a new batch.
func (s *Store) CreateBatch(b *store.Batch) error {
	return s.do(func(ctx context.Context, tx pgx.Tx) error { return s.putBatch(ctx, tx, b, true) })
}

// GetBatch returns batch id, or ErrNotFound.
func (s *Store) GetBatch(id string) (*store.Batch, error) {
	var b *store.Batch
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		var err error
		b, err = getBatch(ctx, tx, id, s.now(), "")
		return err
	})
	return b, err
}

// getBatch reads batch id (lock: "" or " FOR UPDATE").
func getBatch(ctx context.Context, tx pgx.Tx, id string, now time.Time, lock string) (*store.Batch, error) {
	if !storable(id) {
		return nil, domain{store.ErrNotFound}
	}
	var doc []byte
	err := tx.QueryRow(ctx, `SELECT doc FROM batches WHERE id = $1 AND (purge_at IS NULL OR purge_at > $2)`+lock, id, now).Scan(&doc)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, domain{store.ErrNotFound}
	}
	if err != nil {
		return nil, err
	}
	b := new(store.Batch)
	if err := json.Unmarshal(doc, b); err != nil {
		return nil, fmt.Errorf("batch document: %w", err)
	}
	return b, nil
}

// putBatch inserts or rewrites b; a final one gets its purge time and its event.
func (s *Store) putBatch(ctx context.Context, tx pgx.Tx, b *store.Batch, insert bool) error {
	doc, err := json.Marshal(b)
	if err != nil {
		return err
	}
	var purge *time.Time
	if b.Status.Final() {
		p := b.PurgeAt()
		purge = &p
	}
	if insert {
		_, err = tx.Exec(ctx, `INSERT INTO batches (id, scope, status, purge_at, doc) VALUES ($1, $2, $3, $4, $5)`,
			b.ID, b.Scope, string(b.Status), purge, doc)
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE batches SET status = $2, purge_at = $3, doc = $4 WHERE id = $1`,
		b.ID, string(b.Status), purge, doc); err != nil {
		return err
	}
	if !b.Status.Final() {
		return nil
	}
	holdSettled(ctx, b)
	return s.announceBatch(ctx, tx, b)
}

func (s *Store) announceBatch(ctx context.Context, tx pgx.Tx, b *store.Batch) error {
	ev := store.PendingBatchEvent(s.batchAnn.ann.Load(), b)
	if ev == nil {
		return nil
	}
	return putEvent(ctx, tx, ev, s.now())
}

// UpdateBatch applies fn to batch id under its row lock and settles it (see store.Batches).
func (s *Store) UpdateBatch(id string, fn func(*store.Batch) error) (*store.Batch, error) {
	var out *store.Batch
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		now := s.now()
		b, err := getBatch(ctx, tx, id, now, " FOR UPDATE")
		if err != nil {
			return err
		}
		out = b
		changed, err := store.UpdateBatchWith(b, now, fn)
		if err != nil || !changed {
			return answer(err)
		}
		return s.putBatch(ctx, tx, b, false)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AddBatchLines stores lines from+1.. of batch id with their requests, under the batch's row
// lock, with one statement per table (see store.Batches).
func (s *Store) AddBatchLines(id string, from int, ops []*store.Operation, reqs []*store.Request) (*store.Batch, error) {
	var out *store.Batch
	queued := false
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		now := s.now()
		b, err := getBatch(ctx, tx, id, now, " FOR UPDATE")
		if err != nil {
			return err
		}
		if b.Created != from || b.Status.Final() {
			return domain{store.ErrStale}
		}
		var writes pipeline // one round trip for the lines' rows
		for i, op := range ops {
			if store.CutLine(b, op, now) || op.Status.Final() {
				store.CountLine(b, op, nil, s.batchAnn.sizer.Load())
			} else {
				queued = true
				reqDoc, err := json.Marshal(reqs[i])
				if err != nil {
					return err
				}
				writes.Exec(ctx, `INSERT INTO operation_requests (op_id, doc, body) VALUES ($1, $2, $3)`, op.ID, reqDoc, nonNil(reqs[i].Body))
			}
			if err := insertNewOp(ctx, &writes, op); err != nil {
				return err
			}
		}
		if err := writes.send(ctx, tx); err != nil {
			return err
		}
		b.Created += len(ops)
		b.UpdatedAt = now
		store.SettleBatch(b, now)
		out = b
		return s.putBatch(ctx, tx, b, false)
	})
	if err != nil {
		return nil, err
	}
	if queued {
		s.poke()
	}
	return out, nil
}

// insertNewOp inserts op's row, as putOp writes it, op being new.
func insertNewOp(ctx context.Context, db execer, op *store.Operation) error {
	args, err := opArgs(op)
	if err != nil {
		return err
	}
	_, err = db.Exec(ctx, insertOp, args...)
	return err
}

// countLine counts a line operation that has just become final into its batch, in the same
// transaction (see the Badger backend's countLine).
func (s *Store) countLine(ctx context.Context, tx pgx.Tx, op *store.Operation, res *store.Response, at time.Time) error {
	if op.Batch == nil || !op.Status.Final() {
		return nil
	}
	b, err := getBatch(ctx, tx, op.Batch.Batch, at, " FOR UPDATE")
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || b.Status.Final() {
		return err
	}
	store.CountLine(b, op, res, s.batchAnn.sizer.Load())
	b.UpdatedAt = at
	store.SettleBatch(b, at)
	return s.putBatch(ctx, tx, b, false)
}

// UnsettledBatches returns the ids of batches not final, oldest first.
func (s *Store) UnsettledBatches() ([]string, error) {
	var ids []string
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		ids = ids[:0]
		rows, err := tx.Query(ctx, `SELECT id FROM batches WHERE purge_at IS NULL ORDER BY id`)
		if err != nil {
			return err
		}
		ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return ids, err
}

// The PostgreSQL Store keeps files and batches.
var _ store.Batches = (*Store)(nil)

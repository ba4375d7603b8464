package badger

import (
	"cmp"
	"errors"
	"expvar"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// durableSync makes every write committed so far durable. Badger's own db.Sync() is not enough
// and not cheap:
//   - It syncs the active memtable's WAL and the active value-log file, but not a memtable
//     rotated since the writes (its WAL is not synced before it is flushed to a table) nor a
//     value-log file finished since (Badger syncs it on rotation only under SyncWrites). So
//     every WAL and value-log file older than the newest of its kind is synced once here: once
//     rotated, it is never written again.
//   - It syncs the WAL before the value log (the newest of each). A WAL entry of a value above ValueThreshold points
//     into the value log; were the WAL on disk and the value log not (a power cut between the
//     two), Badger would replay a pointer to pages never written. The value log goes first
//     here, as Badger's own SyncWrites orders them; what a power cut leaves of writes no sync
//     covered is rolled back at open (recovery.go).
//   - It holds Badger's memtable lock while it msyncs the WAL, and every commit takes that lock
//     exclusively, so all writes, and the reads queued behind them, stall for the whole sync
//     (docs/benchmarks.md, "Syncs and slots"). Where a descriptor of our own can
//     sync pages written through Badger's mapping (Linux), the newest files are synced that way
//     instead (durability_linux.go).
//
// Badger's own SyncWrites(true) would close the first hole too, but it msyncs the WAL once per
// transaction, not per batch: 5x slower claim+complete here (store/bench_test.go).
type durableSync struct {
	db  *badger.DB
	dir string

	// datasync syncs one file's data by path (durability_linux.go); tests watch it.
	datasync func(path string) error
	// vlogName and vlogWritten are the newest value log and the bytes Badger had written to
	// value logs when it was last synced: a sync finding both unchanged skips it (vlogBytesWritten).
	vlogName    string
	vlogWritten int64

	mu     sync.Mutex
	synced map[string]bool // rotated files already synced, and ("seen:") files whose creation is

	// durable is the newest commit version a sync covered: every commit at or below it is on
	// disk. Readers compare what they read with it (fresh.go).
	durable atomic.Uint64
	// persistedAt is when durable was last written to the database (keySynced), so that the
	// check at open reads only what came after (recovery.go).
	persistedAt time.Time
}

func newDurableSync(db *badger.DB, dir string) *durableSync {
	return &durableSync{db: db, dir: dir, datasync: datasyncFile, synced: map[string]bool{}}
}

// sync runs in the group syncer's one goroutine, after the writes it covers committed. It
// covers every commit made before it started, and advances durable to the newest of them.
func (d *durableSync) sync() error {
	upTo := committedVersion(d.db) // before the files: a later commit waits for the next sync
	if err := d.syncFiles(); err != nil {
		return err
	}
	d.durable.Store(max(d.durable.Load(), upTo))
	if time.Since(d.persistedAt) >= persistEvery {
		d.persistedAt = time.Now()
		// Not waited for: the next sync makes it durable, and until then the check at open
		// reads from the one before, which is only more.
		_ = d.db.Update(func(txn *badger.Txn) error { return setSynced(txn, upTo) })
	}
	return nil
}

// persistEvery is how often the durable version is written down for the check at open: the
// check reads every write after it, so it reads at most this much of them beyond the last sync.
const persistEvery = time.Second

// committedVersion is the newest commit version whose write is in Badger's logs: a read
// transaction's timestamp, which Badger hands out only once every commit at or below it has
// been written.
func committedVersion(db *badger.DB) uint64 {
	txn := db.NewTransaction(false)
	defer txn.Discard()
	return txn.ReadTs()
}

func (d *durableSync) syncFiles() error {
	if !ownDescriptors {
		// The newest value log first, through a descriptor of ours (db.Sync syncs the WAL
		// first); a descriptor may not write back pages of Badger's mapping here, so db.Sync
		// follows. Badger's sync before the listing: a rotation after db.Sync leaves the file
		// it synced in the listing as an older one, which is then synced again whole.
		if vlogs, err := d.listed(".vlog"); err != nil {
			return err
		} else if len(vlogs) > 0 {
			if err := fsyncFile(filepath.Join(d.dir, vlogs[len(vlogs)-1])); err != nil {
				return err
			}
		}
		if err := d.db.Sync(); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return err
	}
	mems, vlogs := filesWithExt(entries, ".mem"), filesWithExt(entries, ".vlog")
	// First the listing, then the files: every write registered before this sync is in a file
	// listed, the newest of its kind or an older one. A rotation after the listing leaves the
	// newest synced here, and the next sync finds it older and syncs it again. Every value log
	// before any WAL: a WAL entry may point into any of them.
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.syncRotated(vlogs); err != nil {
		return err
	}
	if ownDescriptors {
		if err := d.syncNewestValueLog(vlogs); err != nil {
			return err
		}
	}
	created := false
	for _, name := range slices.Concat(mems, vlogs) {
		created = created || !d.synced["seen:"+name]
	}
	if created {
		// Badger syncs neither the directory when it creates a WAL nor the key registry it
		// appends a new data key to (encryption at rest) before a new file uses the key: both
		// before the WALs, which a registry without their key could not decrypt at open.
		if err := errors.Join(fsyncFile(filepath.Join(d.dir, badger.KeyRegistryFileName)), fsyncFile(d.dir)); err != nil {
			return err
		}
		for _, name := range slices.Concat(mems, vlogs) {
			d.synced["seen:"+name] = true
		}
	}
	if err := d.syncRotated(mems); err != nil {
		return err
	}
	if ownDescriptors && len(mems) > 0 {
		if err := d.datasync(filepath.Join(d.dir, mems[len(mems)-1])); err != nil {
			return err
		}
	}
	d.forget(mems, ".mem")
	d.forget(vlogs, ".vlog")
	return nil
}

// syncRotated syncs, once, each file of names but the newest (synced by the caller): once
// rotated, a file is never written again.
func (d *durableSync) syncRotated(names []string) error {
	for i, name := range names {
		if i == len(names)-1 || d.synced[name] {
			continue
		}
		if err := fsyncFile(filepath.Join(d.dir, name)); err != nil {
			return err
		}
		d.synced[name] = true
	}
	return nil
}

// listed lists the files of ext in the directory, by id.
func (d *durableSync) listed(ext string) ([]string, error) {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, err
	}
	return filesWithExt(entries, ext), nil
}

// syncNewestValueLog syncs the newest value log through a descriptor of this process
// (durability_linux.go) when Badger wrote to it since its last sync.
func (d *durableSync) syncNewestValueLog(vlogs []string) error {
	if len(vlogs) == 0 {
		return nil
	}
	vlogWritten, counted := d.vlogBytesWritten() // before the sync: later writes count later
	vlog := vlogs[len(vlogs)-1]
	if counted && vlog == d.vlogName && vlogWritten == d.vlogWritten {
		return nil // nothing written to the value log since its last sync
	}
	if err := d.datasync(filepath.Join(d.dir, vlog)); err != nil {
		return err
	}
	if counted {
		d.vlogName, d.vlogWritten = vlog, vlogWritten
	}
	return nil
}

// forget drops what it knows of files of ext that are gone (flushed WALs, collected logs).
func (d *durableSync) forget(present []string, ext string) {
	have := make(map[string]bool, len(present))
	for _, n := range present {
		have[n] = true
	}
	for k := range d.synced {
		name := strings.TrimPrefix(k, "seen:")
		if strings.HasSuffix(name, ext) && !have[name] {
			delete(d.synced, k)
		}
	}
}

// filesWithExt lists the files of ext by their ids, ascending: Badger pads the ids to 5 or 6
// digits, so past 99999 the names no longer sort as the ids do.
func filesWithExt(entries []fs.DirEntry, ext string) []string {
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ext) {
			out = append(out, e.Name())
		}
	}
	id := func(name string) uint64 {
		n, _ := strconv.ParseUint(strings.TrimSuffix(name, filepath.Ext(name)), 10, 64)
		return n
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Compare(id(a), id(b)) })
	return out
}

// fsyncFile syncs a file (or a directory) by path.
func fsyncFile(path string) error { return syncPath(path, (*os.File).Sync) }

// syncPath opens path and syncs it with sync; one gone meanwhile was flushed or collected, its
// content already durable elsewhere.
func syncPath(path string, sync func(*os.File) error) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return sync(f)
}

// vlogBytesWritten reads Badger's count of the bytes it wrote to value logs, in this process
// (the expvar badger_write_bytes_vlog, kept only with Badger's metrics on, as badgerOptions
// sets). Badger adds a write after copying it into the log and before its commit returns, so a
// sync that reads the count first, then finds it unchanged since the value log's last sync, has
// nothing there to sync: most records are below ValueThreshold and live in the WAL alone, and an
// fdatasync with nothing to write still waits for the disk's flush (on the project's machine it
// made a sync take 1.5 ms at the median instead of 0.6 ms; docs/benchmarks.md). Other databases
// of the process count too, which only syncs more. Without the count (metrics off, or a Badger
// that no longer keeps it), every sync syncs the value log.
func (d *durableSync) vlogBytesWritten() (int64, bool) {
	if !d.db.Opts().MetricsEnabled {
		return 0, false
	}
	v, ok := expvar.Get("badger_write_bytes_vlog").(*expvar.Int)
	if !ok {
		return 0, false
	}
	return v.Value(), true
}

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

	badger "github.com/dgraph-io/badger/v4"
)

// durableSync makes every write committed so far durable. Badger's own db.Sync() is not enough
// and not cheap:
//   - It syncs the active memtable's WAL and the active value-log file, but not a memtable
//     rotated since the writes (its WAL is not synced before it is flushed to a table) nor a
//     value-log file finished since (Badger syncs it on rotation only under SyncWrites). So
//     every WAL and value-log file older than the newest of its kind is synced once here: once
//     rotated, it is never written again.
//   - It holds Badger's memtable lock while it msyncs the WAL, and every commit takes that lock
//     exclusively, so all writes, and the reads queued behind them, stall for the whole sync
//     (docs/operating.md, "Syncs and slots"). Where a descriptor of our own can
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
}

func newDurableSync(db *badger.DB, dir string) *durableSync {
	return &durableSync{db: db, dir: dir, datasync: datasyncFile, synced: map[string]bool{}}
}

// sync runs in the group syncer's one goroutine, after the writes it covers committed.
func (d *durableSync) sync() error {
	if !ownDescriptors {
		// Badger's sync first, then the listing: a rotation after db.Sync leaves the file it
		// synced in the listing as an older one, which is then synced again whole.
		if err := d.db.Sync(); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return err
	}
	mems, vlogs := filesWithExt(entries, ".mem"), filesWithExt(entries, ".vlog")
	if ownDescriptors {
		// First the listing, then the files: every write registered before this sync is in a
		// file listed, the newest of its kind or an older one. A rotation after the listing
		// leaves the newest synced here, and the next sync finds it older and syncs it again.
		if err := d.syncNewest(mems, vlogs); err != nil {
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	created := false
	for _, names := range [][]string{mems, vlogs} {
		for i, name := range names {
			if !d.synced["seen:"+name] {
				created = true
			}
			if i == len(names)-1 || d.synced[name] {
				continue // the newest is synced above (or by db.Sync); a rotated one once
			}
			if err := fsyncFile(filepath.Join(d.dir, name)); err != nil {
				errs = append(errs, err)
				continue
			}
			d.synced[name] = true
		}
	}
	if created {
		// Badger syncs neither the directory when it creates a WAL nor the key registry it
		// appends a new data key to (encryption at rest) before a new file uses the key.
		err := errors.Join(fsyncFile(filepath.Join(d.dir, badger.KeyRegistryFileName)), fsyncFile(d.dir))
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for _, name := range slices.Concat(mems, vlogs) {
			d.synced["seen:"+name] = true
		}
	}
	d.forget(mems, ".mem")
	d.forget(vlogs, ".vlog")
	return errors.Join(errs...)
}

// syncNewest syncs the newest WAL and, when Badger wrote to it since its last sync, the newest
// value log, both at once through descriptors of this process (durability_linux.go).
func (d *durableSync) syncNewest(mems, vlogs []string) error {
	vlogWritten, counted := d.vlogBytesWritten() // before the sync: later writes count later
	var paths []string
	if len(mems) > 0 {
		paths = append(paths, filepath.Join(d.dir, mems[len(mems)-1]))
	}
	vlog := ""
	if len(vlogs) > 0 {
		vlog = vlogs[len(vlogs)-1]
		if counted && vlog == d.vlogName && vlogWritten == d.vlogWritten {
			vlog = "" // nothing written to the value log since its last sync
		} else {
			paths = append(paths, filepath.Join(d.dir, vlog))
		}
	}
	errs := make(chan error, len(paths))
	for _, p := range paths {
		go func() { errs <- d.datasync(p) }()
	}
	var all []error
	for range paths {
		all = append(all, <-errs)
	}
	if err := errors.Join(all...); err != nil {
		return err
	}
	if vlog != "" && counted {
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
// made a sync take 1.5 ms at the median instead of 0.6 ms; docs/operating.md). Other databases
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

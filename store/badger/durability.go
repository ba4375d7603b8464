package badger

import (
	"errors"
	"expvar"
	"io/fs"
	"os"
	"path/filepath"
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
//     (docs/operating.md, "Badger's sync without its lock"). Where a descriptor of our own can
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
	synced map[string]bool // rotated files already synced, and WALs whose directory entry is
}

func newDurableSync(db *badger.DB, dir string) *durableSync {
	return &durableSync{db: db, dir: dir, datasync: datasyncFile, synced: map[string]bool{}}
}

// sync runs in the group syncer's one goroutine, after the writes it covers committed.
func (d *durableSync) sync() error {
	// First the listing, then the files: every write registered before this sync is in a file
	// listed, the newest of its kind or an older one. A rotation after the listing leaves the
	// newest synced here, and the next sync finds it older and syncs it again whole.
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return err
	}
	vlogWritten, counted := vlogBytesWritten() // before the sync: later writes count later
	var active []string
	var vlog string
	if names := filesWithExt(entries, ".mem"); len(names) > 0 {
		active = append(active, filepath.Join(d.dir, names[len(names)-1]))
	}
	if names := filesWithExt(entries, ".vlog"); len(names) > 0 {
		vlog = names[len(names)-1]
		if !counted || vlog != d.vlogName || vlogWritten != d.vlogWritten {
			active = append(active, filepath.Join(d.dir, vlog))
		} else {
			vlog = "" // nothing written to the value log since its last sync
		}
	}
	if err := d.syncActive(active); err != nil {
		return err
	}
	if vlog != "" && counted {
		d.vlogName, d.vlogWritten = vlog, vlogWritten
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for _, ext := range []string{".mem", ".vlog"} {
		names := filesWithExt(entries, ext) // ascending: the names are zero-padded ids
		newDir := false
		for i, name := range names {
			newest := i == len(names)-1
			if ext == ".mem" && !d.synced["dir:"+name] {
				// Badger does not sync the directory when it creates a WAL.
				d.synced["dir:"+name], newDir = true, true
			}
			if newest || d.synced[name] {
				continue
			}
			if err := fsyncFile(filepath.Join(d.dir, name)); err != nil {
				errs = append(errs, err)
				continue
			}
			d.synced[name] = true
		}
		if newDir {
			errs = append(errs, fsyncFile(d.dir))
		}
		d.forget(names, ext)
	}
	return errors.Join(errs...)
}

// forget drops what it knows of files of ext that are gone (flushed WALs, collected logs).
func (d *durableSync) forget(present []string, ext string) {
	have := make(map[string]bool, len(present))
	for _, n := range present {
		have[n] = true
	}
	for k := range d.synced {
		name := strings.TrimPrefix(k, "dir:")
		if strings.HasSuffix(name, ext) && !have[name] {
			delete(d.synced, k)
		}
	}
}

func filesWithExt(entries []fs.DirEntry, ext string) []string {
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ext) {
			out = append(out, e.Name())
		}
	}
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
// (the expvar badger_write_bytes_vlog, kept with Options.MetricsEnabled). Badger adds a write
// after copying it into the log and before its commit returns, so a sync that reads the count
// first, then finds it unchanged since the value log's last sync, has nothing there to sync:
// most records are below ValueThreshold and live in the WAL alone, and an fdatasync with nothing
// to write still waits for the disk's flush (on the project's machine it made a sync take 1.5 ms
// at the median instead of 0.6 ms; docs/operating.md). Other databases of the process count
// too, which only syncs more. Without the count (a Badger that no longer keeps it), every sync
// syncs the value log.
func vlogBytesWritten() (int64, bool) {
	v, ok := expvar.Get("badger_write_bytes_vlog").(*expvar.Int)
	if !ok {
		return 0, false
	}
	return v.Value(), true
}

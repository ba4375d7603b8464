package badger

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	badger "github.com/dgraph-io/badger/v4"
)

// durableSync makes every write committed so far durable. db.Sync() alone does not: it syncs the
// active memtable's WAL and the active value-log file, but not a memtable rotated since the
// writes (its WAL is not synced before it is flushed to a table) nor a value-log file finished
// since (Badger syncs it on rotation only under SyncWrites). So after db.Sync, every WAL and
// value-log file older than the newest of its kind is synced once: once rotated, it is never
// written again. Badger's own SyncWrites(true) would close the hole too, but it msyncs the WAL
// once per transaction, not per batch: 5x slower claim+complete here (store/bench_test.go).
type durableSync struct {
	db  *badger.DB
	dir string

	mu     sync.Mutex
	synced map[string]bool // rotated files already synced, and WALs whose directory entry is
}

func newDurableSync(db *badger.DB, dir string) *durableSync {
	return &durableSync{db: db, dir: dir, synced: map[string]bool{}}
}

// sync runs in the group syncer's one goroutine, after the writes it covers committed.
func (d *durableSync) sync() error {
	// First the active files, then the listing: a rotation after db.Sync leaves the file it
	// synced in the listing as an older one, which is then synced again whole.
	if err := d.db.Sync(); err != nil {
		return err
	}
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return err
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

// fsyncFile syncs a file (or a directory) by path; one gone meanwhile was flushed or collected,
// its content already durable elsewhere.
func fsyncFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

package badger

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// A sync holds none of Badger's locks: while the newest value log and WAL are being synced,
// the store commits and reads on. Through db.Sync every commit waited for the WAL's msync. The
// value log goes first: a WAL on disk must never point into value-log pages that are not.
func TestSyncLeavesBadgerWritable(t *testing.T) {
	st := openTemp(t, true)
	d := newDurableSync(st.sh.db, st.sh.dir)
	entered := make(chan string, 2)
	release := make(chan struct{})
	d.datasync = func(path string) error {
		entered <- filepath.Base(path)
		<-release
		return datasyncFile(path)
	}
	synced := make(chan error, 1)
	go func() { synced <- d.sync() }()
	next := func() string {
		select {
		case name := <-entered:
			return name
		case <-time.After(10 * time.Second):
			t.Fatal("the sync did not reach the active files")
			return ""
		}
	}
	entries, err := os.ReadDir(st.sh.dir)
	if err != nil {
		t.Fatal(err)
	}
	mems, vlogs := filesWithExt(entries, ".mem"), filesWithExt(entries, ".vlog")
	if got := next(); got != vlogs[len(vlogs)-1] {
		t.Errorf("synced %s first, want the newest value log %s", got, vlogs[len(vlogs)-1])
	}
	select {
	case name := <-entered:
		t.Errorf("%s synced while the value log's sync was still running", name)
	default:
	}

	wrote := make(chan error, 1)
	go func() {
		wrote <- st.sh.db.Update(func(txn *badger.Txn) error { return txn.Set([]byte("k"), []byte("v")) })
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("a commit waited for the sync")
	}
	close(release)
	if got := next(); got != mems[len(mems)-1] {
		t.Errorf("synced %s second, want the newest WAL %s", got, mems[len(mems)-1])
	}
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
}

// A sync skips the value log while nothing was written to it (records below ValueThreshold live
// in the WAL alone), and syncs it again once a value went there.
func TestSyncSkipsAnUnchangedValueLog(t *testing.T) {
	st := openTemp(t, true)
	d := newDurableSync(st.sh.db, st.sh.dir)
	var mu sync.Mutex // the active files are synced at once
	var synced []string
	d.datasync = func(path string) error {
		mu.Lock()
		synced = append(synced, filepath.Ext(path))
		mu.Unlock()
		return datasyncFile(path)
	}
	syncAfter := func(value []byte) []string {
		t.Helper()
		if err := st.sh.db.Update(func(txn *badger.Txn) error { return txn.Set([]byte("k"), value) }); err != nil {
			t.Fatal(err)
		}
		synced = nil
		if err := d.sync(); err != nil {
			t.Fatal(err)
		}
		slices.Sort(synced)
		return synced
	}
	syncAfter([]byte("small")) // the first sync syncs both
	if got := syncAfter([]byte("small")); !slices.Equal(got, []string{".mem"}) {
		t.Errorf("after a small value, synced %v, want the WAL alone", got)
	}
	if got := syncAfter(make([]byte, 4<<10)); !slices.Equal(got, []string{".mem", ".vlog"}) {
		t.Errorf("after a value over the threshold, synced %v, want the WAL and the value log", got)
	}
	if got := syncAfter([]byte("small")); !slices.Equal(got, []string{".mem"}) {
		t.Errorf("after a small value again, synced %v, want the WAL alone", got)
	}
}

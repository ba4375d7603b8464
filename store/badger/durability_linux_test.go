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

// A sync holds none of Badger's locks: while the newest WAL and value log are being synced,
// the store commits and reads on. Through db.Sync every commit waited for the WAL's msync.
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
	var got []string
	for range 2 {
		select {
		case name := <-entered:
			got = append(got, name)
		case <-time.After(10 * time.Second):
			t.Fatal("the sync did not reach both active files")
		}
	}
	entries, err := os.ReadDir(st.sh.dir)
	if err != nil {
		t.Fatal(err)
	}
	mems, vlogs := filesWithExt(entries, ".mem"), filesWithExt(entries, ".vlog")
	want := []string{mems[len(mems)-1], vlogs[len(vlogs)-1]}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("synced %v, want the newest WAL and value log %v", got, want)
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

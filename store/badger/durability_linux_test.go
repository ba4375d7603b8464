package badger

import (
	"os"
	"path/filepath"
	"slices"
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

package badger

import (
	"bytes"
	"crypto/rand"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
)

// TestOlderValueLogsArePagedOutAndReadBackWhole: a file written through several value logs
// leaves the finished ones' pages resident (Badger writes through its mapping); paging them out
// leaves them and the tables at most residentSlack resident together, the newest untouched, and
// the file reads back byte for byte, before and after a reopen (docs/backends.md, "Badger's
// memory").
func TestOlderValueLogsArePagedOutAndReadBackWhole(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, Sync: true, pageOutEvery: -1, Memory: Memory{ValueLogFileSize: 4 << 20}}
	st, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	content, f := writeBigFile(t, st, 24<<20)
	files, before := olderResident(t, st)
	if files < 3 || before <= 2*residentSlack {
		t.Fatalf("%d older value logs and tables mapped, %d bytes resident: want several, over %d", files, before, 2*residentSlack)
	}
	if out := st.sh.pageOutFiles(); out < residentSlack {
		t.Fatalf("paged out %d bytes, want the older value logs' pages", out)
	}
	if _, after := olderResident(t, st); after > residentSlack {
		t.Fatalf("the older value logs and the tables keep %d bytes resident after the page-out (before: %d), want at most %d", after, before, residentSlack)
	}
	readBack := func(st *Store) {
		t.Helper()
		rc, err := st.OpenFile(f.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		got, err := io.ReadAll(rc)
		if err != nil || !bytes.Equal(got, content) {
			t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(content))
		}
	}
	readBack(st)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err = Open(opts); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	readBack(st)
}

// A file written at disk speed is paged out each time residentGrowth bytes of it went through
// the value logs, without waiting for the periodic page-out (an hour here), whatever the rest
// of the process's resident set does: of 48 MiB written, at most residentGrowth stays behind
// beside residentSlack.
func TestValueLogsArePagedOutAsFilesGoThrough(t *testing.T) {
	st, err := Open(Options{Dir: t.TempDir(), Sync: true, pageOutEvery: time.Hour, Memory: Memory{ValueLogFileSize: 4 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	writeBigFile(t, st, 48<<20)
	testkit.WaitFor(t, 10*time.Second, "the older value logs paged out", func() bool {
		_, resident := olderResident(t, st)
		return resident <= residentSlack+residentGrowth
	})
}

// writeBigFile stores a file of size random bytes, in 1 MiB chunks (4 MiB value logs: one
// for each 4 MiB).
func writeBigFile(t *testing.T, st *Store, size int) ([]byte, *store.File) {
	t.Helper()
	content := make([]byte, size)
	_, _ = rand.Read(content)
	now := time.Now()
	f := &store.File{ID: "file-big", Scope: "s", Purpose: "batch", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := st.CreateFile(f, bytes.NewReader(content), store.FileLimits{MaxBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	return content, f
}

// olderResident counts the mapped tables and value logs but the newest, and sums what they
// keep resident.
func olderResident(t *testing.T, st *Store) (n int, resident int64) {
	t.Helper()
	maps, err := mappedFiles(st.sh.dir)
	if err != nil {
		t.Fatal(err)
	}
	newest := ""
	for _, m := range maps {
		if strings.HasSuffix(m.path, ".vlog") && m.path > newest {
			newest = m.path
		}
	}
	for _, m := range maps {
		if (strings.HasSuffix(m.path, ".vlog") && m.path != newest) || strings.HasSuffix(m.path, ".sst") {
			n++
			resident += m.resident
		}
	}
	return n, resident
}

package badger

import (
	"bytes"
	"crypto/rand"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// TestOlderValueLogsArePagedOutAndReadBackWhole: a file written through several value logs
// leaves the finished ones' pages resident (Badger writes through its mapping); paging them out
// leaves each at most residentSlack resident, the newest untouched, and the file reads back
// byte for byte, before and after a reopen (docs/backends.md, "Badger's memory").
func TestOlderValueLogsArePagedOutAndReadBackWhole(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, Sync: true, pageOutEvery: -1, Memory: Memory{ValueLogFileSize: 4 << 20}}
	st, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	content := make([]byte, 24<<20) // six value logs' worth of 1 MiB chunks
	_, _ = rand.Read(content)
	now := time.Now()
	f := &store.File{ID: "file-big", Scope: "s", Purpose: "batch", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := st.CreateFile(f, bytes.NewReader(content), store.FileLimits{MaxBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	older := func() (n int, resident int64) {
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
			if strings.HasSuffix(m.path, ".vlog") && m.path != newest {
				n++
				resident = max(resident, m.resident)
			}
		}
		return n, resident
	}
	files, before := older()
	if files < 3 || before <= residentSlack {
		t.Fatalf("%d older value logs mapped, the most resident %d bytes: want several, over %d", files, before, residentSlack)
	}
	if out := st.sh.pageOutOlderLogs(); out < 2*residentSlack {
		t.Fatalf("paged out %d bytes, want the older value logs' pages", out)
	}
	if _, after := older(); after > residentSlack {
		t.Fatalf("an older value log keeps %d bytes resident after the page-out (before: %d), want at most %d", after, before, residentSlack)
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

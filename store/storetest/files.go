package storetest

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// mib is n MiB of content: several of the backends' 1 MiB chunks.
func mib(n float64) string { return strings.Repeat("x", int(n*(1<<20))) }

// upload stores a file of content in scope under lim.
func (e *env) upload(s store.Backend, scope, id string, content io.Reader, lim store.FileLimits) error {
	now := e.clock.Now()
	return s.CreateFile(&store.File{ID: id, Scope: scope, Purpose: "batch", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, content, lim)
}

// testScopeFileQuota: an upload that would take its scope over its bytes or its count is
// refused with ErrFileQuota and leaves nothing (its room is there for the next upload); other
// scopes have their own room, and a deleted file gives its room back.
func testScopeFileQuota(t *testing.T, e *env) {
	s := e.open()
	lim := store.FileLimits{MaxBytes: 1 << 30, ScopeBytes: 3 << 20, ScopeFiles: 2}
	steps := []struct {
		scope, id string
		size      float64
		want      error
	}{
		{"a", "file-1", 2, nil},
		{"a", "file-2", 1.5, store.ErrFileQuota}, // its first chunk fits, its second does not
		{"a", "file-3", 0.5, nil},                // the refused file's chunk was given back
		{"a", "file-4", 0, store.ErrFileQuota},   // a third file, even empty
		{"b", "file-5", 2, nil},                  // scope b has its own room
	}
	for _, st := range steps {
		if err := e.upload(s, st.scope, st.id, strings.NewReader(mib(st.size)), lim); !errors.Is(err, st.want) {
			t.Fatalf("upload %s of %v MiB to scope %s: %v, want %v", st.id, st.size, st.scope, err, st.want)
		}
	}
	for _, id := range []string{"file-2", "file-4"} {
		if _, err := s.GetFile(id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("refused %s is found: %v", id, err)
		}
	}
	if files, _, _ := s.ListFiles("a", "", 10); len(files) != 2 {
		t.Fatalf("scope a lists %d files, want 2", len(files))
	}
	if err := s.DeleteFile("file-1"); err != nil {
		t.Fatal(err)
	}
	if err := e.upload(s, "a", "file-6", strings.NewReader(mib(2.5)), lim); err != nil {
		t.Fatalf("an upload into a deleted file's room: %v", err)
	}
}

// testUploadInProgressCounts: the bytes an upload has stored count against its scope before it
// ends, so a second upload cannot slip into the room the first is filling.
func testUploadInProgressCounts(t *testing.T, e *env) {
	s := e.open()
	lim := store.FileLimits{MaxBytes: 1 << 30, ScopeBytes: 3 << 19, ScopeFiles: 10} // 1.5 MiB
	pr, pw := io.Pipe()
	first := make(chan error, 1)
	go func() { first <- e.upload(s, "a", "file-1", pr, lim) }()
	if _, err := io.WriteString(pw, mib(1)); err != nil {
		t.Fatal(err)
	}
	// This byte is read for the next chunk only once the first chunk is stored.
	if _, err := pw.Write([]byte{'x'}); err != nil {
		t.Fatal(err)
	}
	if err := e.upload(s, "a", "file-2", strings.NewReader(mib(1)), lim); !errors.Is(err, store.ErrFileQuota) {
		t.Fatalf("an upload beside one in progress that fills the room: %v, want ErrFileQuota", err)
	}
	_ = pw.Close()
	if err := <-first; err != nil {
		t.Fatalf("the upload in progress: %v", err)
	}
}

// testConcurrentUploadsFitTheQuota: uploads of one scope started together never both pass a
// quota with room for one, by count or by bytes.
func testConcurrentUploadsFitTheQuota(t *testing.T, e *env) {
	s := e.open()
	race := func(scope string, n int, size float64, lim store.FileLimits) (stored int) {
		start := make(chan struct{})
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = e.upload(s, scope, fmt.Sprintf("file-%s-%d", scope, i), strings.NewReader(mib(size)), lim)
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			switch {
			case err == nil:
				stored++
			case !errors.Is(err, store.ErrFileQuota):
				t.Fatalf("a concurrent upload: %v", err)
			}
		}
		files, _, err := s.ListFiles(scope, "", 100)
		if err != nil || len(files) != stored {
			t.Fatalf("scope %s lists %d files (%v); %d uploads succeeded", scope, len(files), err, stored)
		}
		return stored
	}
	for round := range 20 {
		if n := race(fmt.Sprint("a", round), 8, 0.01, store.FileLimits{MaxBytes: 1 << 30, ScopeFiles: 1}); n != 1 {
			t.Fatalf("%d of 8 uploads fit a scope room for one file", n)
		}
	}
	if n := race("b", 6, 1.5, store.FileLimits{MaxBytes: 1 << 30, ScopeBytes: 2 << 20, ScopeFiles: 100}); n > 1 {
		t.Fatalf("%d of 6 uploads of 1.5 MiB fit a scope room for 2 MiB", n)
	}
}

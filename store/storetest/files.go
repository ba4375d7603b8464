package storetest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// testLinesSizedWithTheirCount: each line's size is added to its batch's file sizes in the
// transaction that counts it, whichever way it ends (a result, none, cut at its creation); a
// batch that did not start sized stays unsized, so its files are assembled to size them.
func testLinesSizedWithTheirCount(t *testing.T, e *env) {
	s := e.open()
	s.SetBatchLineSizer(func(op *store.Operation, res *store.Response) int64 {
		if res != nil {
			return 100 + int64(len(res.Body))
		}
		return 7
	})
	e.newBatchSized(t, s, 4, &store.BatchFileBytes{})
	ops, reqs := e.lines(0, 3)
	if _, err := s.AddBatchLines("batch_1", 0, ops, reqs); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		op, err := s.ClaimNext("w", time.Minute)
		if err != nil || op == nil || op.Batch == nil {
			t.Fatalf("claim %d: %v %v", i, op, err)
		}
		c := store.Change{To: store.StatusSucceeded, Holder: "w", Result: &store.Response{Status: 200, Header: http.Header{}, Body: []byte("hello")}}
		switch op.Batch.Line {
		case 2:
			c = store.Change{To: store.StatusFailed, Holder: "w", Result: &store.Response{Status: 400, Header: http.Header{}, Body: []byte("no")},
				Error: &store.OperationError{Code: "UPSTREAM_REJECTED"}}
		case 3:
			c = store.Change{To: store.StatusFailed, Holder: "w", Error: &store.OperationError{Code: "OPERATION_TIMEOUT"}}
		}
		if _, err := s.Transition(op.ID, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.UpdateBatch("batch_1", func(b *store.Batch) error { b.Status = store.BatchCancelling; return nil }); err != nil {
		t.Fatal(err)
	}
	ops, reqs = e.lines(3, 1) // created cut: the batch is cancelling
	b, err := s.AddBatchLines("batch_1", 3, ops, reqs)
	if err != nil || b.Status != store.BatchCancelled {
		t.Fatalf("batch %+v (%v), want cancelled", b, err)
	}
	want := store.BatchFileBytes{Output: 105, Errors: 102 + 7 + 7}
	if b, err = s.GetBatch("batch_1"); err != nil || b.FileBytes == nil || *b.FileBytes != want {
		t.Fatalf("the settled batch's file sizes: %+v (%v), want %+v", b.FileBytes, err, want)
	}

	unsized := &store.Batch{ID: "batch_2", Scope: "a", Endpoint: "/v1/x", Status: store.BatchValidating, CreatedAt: e.clock.Now(),
		ExpiresAt: e.clock.Now().Add(time.Hour), Retention: time.Hour}
	if err := s.CreateBatch(unsized); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateBatch("batch_2", func(b *store.Batch) error {
		b.Status, b.Counts.Total = store.BatchInProgress, 1
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	gone := e.newOp(900, "batch_2")
	gone.ID, gone.Batch = store.LineOperationID("batch_2", 1), &store.BatchLine{Batch: "batch_2", Line: 1}
	gone.Status, gone.FinishedAt = store.StatusFailed, e.clock.Now()
	gone.Error = &store.OperationError{Code: store.LineInputGone}
	if b, err := s.AddBatchLines("batch_2", 0, []*store.Operation{gone}, []*store.Request{nil}); err != nil || !b.Status.Final() || b.FileBytes != nil {
		t.Fatalf("a batch that did not start sized: %+v (%v), want final without sizes", b, err)
	}
}

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

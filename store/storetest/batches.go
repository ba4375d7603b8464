package storetest

import (
	"bytes"
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

var batchTests = []test{
	{"FilesStreamInChunksAndBelongToTheirScope", testFilesStreamInChunks},
	{"EachLineIsCountedOnceAndTheLastSettlesTheBatch", testLinesCountedOnce},
	{"LinesOfACancelledBatchAreCreatedCancelled", testLinesOfCancelledBatch},
	{"ACutOfAQueuedLineLeavesAClaimedLineRunning", testCutLeavesClaimedLineRunning},
	{"EachLineIsSizedWithItsCountSoTheFilesAreSizedWithoutAssembly", testLinesSizedWithTheirCount},
	{"AScopesStoredFilesAreBoundedInBytesAndCount", testScopeFileQuota},
	{"AnUploadInProgressCountsAgainstItsScopesQuota", testUploadInProgressCounts},
	{"ConcurrentUploadsNeverBothFitARoomForOne", testConcurrentUploadsFitTheQuota},
	{"OfAllHandlesOneIsToldABatchSettled", testOneHandleToldOfSettle},
}

func testFilesStreamInChunks(t *testing.T, e *env) {
	s := e.open()
	now := e.clock.Now()
	content := strings.Repeat("{\"custom_id\":\"x\"}\n", 150000) + "last line without newline" // ~2.7 MiB: several chunks
	f := &store.File{ID: "file-1", Scope: "a", Purpose: "batch", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := s.CreateFile(f, strings.NewReader(content), store.FileLimits{MaxBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if f.Bytes != int64(len(content)) || f.Lines != 150001 {
		t.Fatalf("stored %d bytes, %d lines; want %d, 150001", f.Bytes, f.Lines, len(content))
	}
	rc, err := s.OpenFile("file-1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	_ = rc.Close()
	if err != nil || !bytes.Equal(got, []byte(content)) {
		t.Fatalf("read back %d bytes (%v), want the %d stored", len(got), err, len(content))
	}
	big := &store.File{ID: "file-2", Scope: "a", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := s.CreateFile(big, strings.NewReader(content), store.FileLimits{MaxBytes: 1 << 20}); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("a file over its limit: %v, want ErrTooLarge", err)
	}
	if _, err := s.GetFile("file-2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused file is found: %v", err)
	}
	mine, _, _ := s.ListFiles("a", "", 10)
	theirs, _, _ := s.ListFiles("b", "", 10)
	if len(mine) != 1 || mine[0].ID != "file-1" || len(theirs) != 0 {
		t.Fatalf("scope a lists %d files, scope b %d", len(mine), len(theirs))
	}
	if err := s.DeleteFile("file-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetFile("file-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a deleted file is found: %v", err)
	}
}

// newBatch stores batch "batch_1" of scope a, in progress with total lines.
func (e *env) newBatch(t *testing.T, s store.Backend, total int) {
	t.Helper()
	e.newBatchSized(t, s, total, nil)
}

// newBatchSized is newBatch with the file sizes the batch starts with.
func (e *env) newBatchSized(t *testing.T, s store.Backend, total int, sizes *store.BatchFileBytes) {
	t.Helper()
	now := e.clock.Now()
	b := &store.Batch{ID: "batch_1", Scope: "a", Endpoint: "/v1/x", Status: store.BatchValidating, CreatedAt: now,
		ExpiresAt: now.Add(time.Hour), Retention: time.Hour, Callback: &store.Callback{Endpoint: "hooks", URL: "http://h"},
		FileBytes: sizes}
	if err := s.CreateBatch(b); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateBatch(b.ID, func(b *store.Batch) error {
		b.Status, b.Counts.Total = store.BatchInProgress, total
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// lines are lines from+1..from+n of batch_1.
func (e *env) lines(from, n int) ([]*store.Operation, []*store.Request) {
	var ops []*store.Operation
	var reqs []*store.Request
	for line := from + 1; line <= from+n; line++ {
		op := e.newOp(line, "batch_1")
		op.ID = store.LineOperationID("batch_1", line)
		op.Batch = &store.BatchLine{Batch: "batch_1", Line: line, CustomID: "c"}
		ops = append(ops, op)
		reqs = append(reqs, &store.Request{Method: "POST", URL: "/v1/x", Header: http.Header{}, Body: []byte("{}")})
	}
	return ops, reqs
}

func testLinesCountedOnce(t *testing.T, e *env) {
	s := e.open()
	s.SetBatchAnnouncer(func(b *store.Batch) *store.Event {
		return &store.Event{ID: "evt_" + string(b.Status), Type: "batch." + string(b.Status), OperationID: b.ID,
			Endpoint: "hooks", URL: "http://h", OccurredAt: e.clock.Now()}
	})
	e.newBatch(t, s, 3)
	ops, reqs := e.lines(0, 2)
	if _, err := s.AddBatchLines("batch_1", 0, ops, reqs); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddBatchLines("batch_1", 0, ops, reqs); !errors.Is(err, store.ErrStale) {
		t.Fatalf("lines added twice: %v, want ErrStale", err)
	}
	ops, reqs = e.lines(2, 1)
	if _, err := s.AddBatchLines("batch_1", 2, ops, reqs); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		op, err := s.ClaimNext("w", time.Minute)
		if err != nil || op == nil || op.Batch == nil {
			t.Fatalf("claim %d: %v %v", i, op, err)
		}
		to := store.StatusSucceeded
		if op.Batch.Line == 2 {
			to = store.StatusFailed
		}
		if _, err := s.Transition(op.ID, store.Change{To: to, Holder: "w"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Transition(op.ID, store.Change{To: store.StatusCanceled}); !errors.Is(err, store.ErrIllegalTransition) {
			t.Fatalf("a final line moved again: %v", err)
		}
	}
	b, err := s.GetBatch("batch_1")
	if err != nil || b.Status != store.BatchCompleted || b.Counts != (store.BatchCounts{Total: 3, Completed: 2, Failed: 1}) || b.CompletedAt.IsZero() {
		t.Fatalf("batch %+v (%v), want completed 2 + 1 failed of 3", b, err)
	}
	if ev, err := s.GetEvent("evt_completed"); err != nil || ev.State != store.EventPending {
		t.Fatalf("the batch's event: %v %v", ev, err)
	}
	if ids, _ := s.UnsettledBatches(); len(ids) != 0 {
		t.Fatalf("a final batch is still unsettled: %v", ids)
	}
}

func testLinesOfCancelledBatch(t *testing.T, e *env) {
	s := e.open()
	e.newBatch(t, s, 2)
	if _, err := s.UpdateBatch("batch_1", func(b *store.Batch) error { b.Status = store.BatchCancelling; return nil }); err != nil {
		t.Fatal(err)
	}
	ops, reqs := e.lines(0, 2)
	b, err := s.AddBatchLines("batch_1", 0, ops, reqs)
	if err != nil || b.Status != store.BatchCancelled || b.Counts.Failed != 2 {
		t.Fatalf("batch %+v (%v), want cancelled with 2 failed", b, err)
	}
	op, err := s.GetOperation(store.LineOperationID("batch_1", 1))
	if err != nil || op.Status != store.StatusCanceled || op.Error == nil || op.Error.Code != store.LineCancelled {
		t.Fatalf("line 1: %+v %v, want canceled %s", op, err, store.LineCancelled)
	}
	if next, _ := s.ClaimNext("w", time.Minute); next != nil {
		t.Fatalf("a cancelled batch's line was claimed: %s", next.ID)
	}
}

// testCutLeavesClaimedLineRunning: a line read as queued, then claimed by a runner before the
// batch's cut lands, keeps running; the cut of a line still queued cancels it.
func testCutLeavesClaimedLineRunning(t *testing.T, e *env) {
	s := e.open()
	e.newBatch(t, s, 2)
	ops, reqs := e.lines(0, 2)
	if _, err := s.AddBatchLines("batch_1", 0, ops, reqs); err != nil {
		t.Fatal(err)
	}
	claimed, err := s.ClaimNext("w", time.Minute)
	if err != nil || claimed == nil {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	cut := store.Change{To: store.StatusCanceled, From: store.StatusQueued,
		Error: &store.OperationError{Code: store.LineCancelled, Message: "cut"}}
	if _, err := s.Transition(claimed.ID, cut); !errors.Is(err, store.ErrIllegalTransition) {
		t.Fatalf("the cut of a claimed line: %v, want ErrIllegalTransition", err)
	}
	if op, err := s.GetOperation(claimed.ID); err != nil || op.Status != store.StatusRunning || op.Holder != "w" {
		t.Fatalf("the claimed line after the cut: %+v %v, want running held by w", op, err)
	}
	other := store.LineOperationID("batch_1", 3-claimed.Batch.Line)
	if op, err := s.Transition(other, cut); err != nil || op.Status != store.StatusCanceled {
		t.Fatalf("the cut of a queued line: %+v %v, want canceled", op, err)
	}
	if _, err := s.Transition(claimed.ID, store.Change{To: store.StatusSucceeded, Holder: "w"}); err != nil {
		t.Fatalf("the runner's result after the cut: %v", err)
	}
}

// testOneHandleToldOfSettle: three handles (three replicas on PostgreSQL) finish a batch's
// lines at once; the batch settles once, and exactly one handle is told, once, after the
// commit (what mulligan_batches_finished_total counts: docs/operating.md sums it across
// replicas). A batch failed by an update is told once too; a final batch touched again, never.
func testOneHandleToldOfSettle(t *testing.T, e *env) {
	handles := []store.Backend{e.open(), e.open(), e.open()}
	var mu sync.Mutex
	told := map[string][]store.BatchStatus{}
	for _, h := range handles {
		h.SetBatchSettled(func(b *store.Batch) {
			mu.Lock()
			told[b.ID] = append(told[b.ID], b.Status)
			mu.Unlock()
		})
	}
	const n = 30
	e.newBatch(t, handles[0], n)
	ops, reqs := e.lines(0, n)
	if _, err := handles[1].AddBatchLines("batch_1", 0, ops, reqs); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			h := handles[w%len(handles)]
			for {
				op, err := h.ClaimNext(fmt.Sprintf("w%d", w), time.Minute)
				if err != nil || op == nil {
					return
				}
				if _, err := h.Transition(op.ID, store.Change{To: store.StatusSucceeded, Holder: fmt.Sprintf("w%d", w)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b := must(handles[2].GetBatch("batch_1"))(t); b.Status != store.BatchCompleted || b.Counts.Completed != n {
		t.Fatalf("batch %+v, want completed with %d lines", b, n)
	}
	_, _ = handles[0].UpdateBatch("batch_1", func(b *store.Batch) error { b.Status = store.BatchCancelling; return nil })
	now := e.clock.Now()
	failed := &store.Batch{ID: "batch_2", Scope: "a", Endpoint: "/v1/x", Status: store.BatchValidating,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), Retention: time.Hour}
	if err := handles[0].CreateBatch(failed); err != nil {
		t.Fatal(err)
	}
	if _, err := handles[2].UpdateBatch("batch_2", func(b *store.Batch) error {
		b.Status, b.FailedAt = store.BatchFailed, now
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := told["batch_1"]; len(got) != 1 || got[0] != store.BatchCompleted {
		t.Fatalf("told of batch_1's settle %v, want [completed] once", got)
	}
	if got := told["batch_2"]; len(got) != 1 || got[0] != store.BatchFailed {
		t.Fatalf("told of batch_2's settle %v, want [failed] once", got)
	}
}

package batches

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zaptest"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

const chatPath = "/v1/chat/completions"

// runnerLines is the worker's runner in these tests: it records what the worker asks. Lines
// are executed (or not) by the test itself, through the store, as a runner would.
type runnerLines struct {
	kicks atomic.Int64
	mu    sync.Mutex
	cut   []string
}

func (l *runnerLines) Kick()            { l.kicks.Add(1) }
func (l *runnerLines) Cancel(id string) {}
func (l *runnerLines) Cut(op *store.Operation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = append(l.cut, op.ID)
}

// fixture is a real Badger storage on a temp dir and the fake clock it and the worker share.
type fixture struct {
	st    *badger.Store
	clock *clockwork.FakeClock
	lines *runnerLines
	t     *testing.T
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	// At the real time: Badger expires records (a final batch past its retention) on the wall clock.
	clock := clockwork.NewFakeClockAt(time.Now().UTC().Truncate(time.Millisecond))
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return &fixture{st: st, clock: clock, lines: &runnerLines{}, t: t}
}

func (f *fixture) worker(st store.Backend) *Worker {
	if st == nil {
		st = f.st
	}
	return New(Options{Store: st, Lines: f.lines, Clock: f.clock, Log: zaptest.NewLogger(f.t)})
}

// input is a batch input of n valid lines.
func input(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":%q,"body":{"n":%d}}`+"\n", i, chatPath, i)
	}
	return b.String()
}

// batch stores a file of content and a batch validating it, expiring after window.
func (f *fixture) batch(t *testing.T, id, content string, window time.Duration) *store.Batch {
	t.Helper()
	now := f.clock.Now()
	file := &store.File{ID: "file-" + id, Scope: "s", Purpose: "batch", CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour)}
	if err := f.st.CreateFile(file, strings.NewReader(content), store.FileLimits{MaxBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	b := &store.Batch{ID: "batch_" + id, Scope: "s", Endpoint: chatPath, InputFileID: file.ID, CompletionWindow: "24h",
		Status: store.BatchValidating, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(window), Retention: time.Hour}
	if err := f.st.CreateBatch(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// awaitBatch kicks w until batch id meets cond: a pass takes one step of a batch (validate, or
// create lines, or cut), and the fake clock's ticker never fires on its own.
func (f *fixture) awaitBatch(t *testing.T, w *Worker, id, what string, cond func(b *store.Batch) bool) *store.Batch {
	t.Helper()
	var b *store.Batch
	testkit.WaitFor(t, 5*time.Second, what, func() bool {
		w.Kick()
		var err error
		b, err = f.st.GetBatch(id)
		return err == nil && cond(b)
	})
	return b
}

// TestWorkerValidatesABatchAndCreatesItsLinesWithinTheWindow: a kicked worker validates the input,
// puts the batch in progress with its total, creates its lines as queued operations at urgency
// 7 up to the window, and kicks the runner; the rest waits for lines to finish.
func TestWorkerValidatesABatchAndCreatesItsLinesWithinTheWindow(t *testing.T) {
	f := newFixture(t)
	const n = LineWindow + 5
	b := f.batch(t, "win", input(n), 24*time.Hour)
	w := f.worker(nil)
	w.Start()
	defer w.Stop()
	w.Kick()
	got := f.awaitBatch(t, w, b.ID, "the window's lines created", func(b *store.Batch) bool { return b.Created == LineWindow })
	if got.Status != store.BatchInProgress || got.Counts.Total != n {
		t.Fatalf("batch %s with total %d, want in_progress with %d", got.Status, got.Counts.Total, n)
	}
	op, err := f.st.GetOperation(store.LineOperationID(b.ID, LineWindow))
	if err != nil || op.Status != store.StatusQueued || op.Urgency != 7 || op.Batch.CustomID != fmt.Sprint("req-", LineWindow) {
		t.Fatalf("line %d: %+v %v, want queued at urgency 7 as req-%d", LineWindow, op, err, LineWindow)
	}
	if f.lines.kicks.Load() == 0 {
		t.Fatal("the runner was never kicked after lines were created")
	}
	if _, err := f.st.GetOperation(store.LineOperationID(b.ID, LineWindow+1)); err == nil {
		t.Fatal("a line past the window was created before any line finished")
	}
}

// TestWorkerExpiresTheLinesNotStartedWhenTheWindowPasses: on the fake clock, past the completion
// window the queued lines are cut expired and counted as the runner counts lines, and the batch
// ends expired.
func TestWorkerExpiresTheLinesNotStartedWhenTheWindowPasses(t *testing.T) {
	f := newFixture(t)
	b := f.batch(t, "exp", input(3), time.Minute)
	w := f.worker(nil)
	w.Start()
	defer w.Stop()
	w.Kick()
	f.awaitBatch(t, w, b.ID, "the lines created", func(b *store.Batch) bool { return b.Created == 3 })
	f.clock.Advance(time.Minute + sweepEvery)
	got := f.awaitBatch(t, w, b.ID, "the batch expired", func(b *store.Batch) bool { return b.Status.Final() })
	if got.Status != store.BatchExpired || got.Counts.Failed != 3 {
		t.Fatalf("batch %s %+v, want expired with 3 failed", got.Status, got.Counts)
	}
	op, err := f.st.GetOperation(store.LineOperationID(b.ID, 2))
	if err != nil || op.Error == nil || op.Error.Code != store.LineExpired {
		t.Fatalf("line 2: %+v %v, want cut with %s", op, err, store.LineExpired)
	}
	// The storage settles the batch with its last line's transition, and the worker counts that
	// line cut just after: the count can trail the batch's final status by a moment.
	testkit.WaitFor(t, 5*time.Second, "the 3 lines counted as cut", func() bool {
		f.lines.mu.Lock()
		defer f.lines.mu.Unlock()
		return len(f.lines.cut) == 3
	})
}

// blockingStore holds the worker's first GetBatch until released, and notes each UpdateBatch.
type blockingStore struct {
	store.Backend
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	updated atomic.Bool
}

func (s *blockingStore) GetBatch(id string) (*store.Batch, error) {
	s.once.Do(func() { close(s.entered); <-s.release })
	return s.Backend.GetBatch(id)
}

func (s *blockingStore) UpdateBatch(id string, fn func(*store.Batch) error) (*store.Batch, error) {
	b, err := s.Backend.UpdateBatch(id, fn)
	s.updated.Store(true)
	return b, err
}

// TestWorkerStopWaitsForThePassUnderWay: Stop returns after the pass it interrupts has written
// what it was writing, so the storage may close right after (docs/batches.md); after Stop no
// pass runs, kicked or not.
func TestWorkerStopWaitsForThePassUnderWay(t *testing.T) {
	f := newFixture(t)
	b := f.batch(t, "stop", input(2), 24*time.Hour)
	bs := &blockingStore{Backend: f.st, entered: make(chan struct{}), release: make(chan struct{})}
	w := f.worker(bs)
	w.Start()
	w.Kick()
	<-bs.entered // a pass is reading the batch
	stopped := make(chan struct{})
	go func() { w.Stop(); close(stopped) }()
	close(bs.release)
	<-stopped
	if !bs.updated.Load() {
		t.Fatal("Stop returned before the pass under way had validated the batch")
	}
	later := f.batch(t, "later", input(1), 24*time.Hour)
	w.Kick()
	f.clock.Advance(10 * passEvery)
	w.Stop() // again: a no-op
	if got, err := f.st.GetBatch(later.ID); err != nil || got.Status != store.BatchValidating {
		t.Fatalf("a batch created after Stop: %+v %v, want it left validating", got, err)
	}
	if got, _ := f.st.GetBatch(b.ID); got.Status != store.BatchInProgress {
		t.Fatalf("the batch the stopped pass validated: %s", got.Status)
	}
}

// finishLines ends the first n queued lines of batch b from line `from`, as a runner would
// (here: cut, which counts them failed), and returns the line after the last one ended.
func (f *fixture) finishLines(t *testing.T, b *store.Batch, from, n int) int {
	t.Helper()
	for line := from; line < from+n; line++ {
		_, err := f.st.Transition(store.LineOperationID(b.ID, line), store.Change{To: store.StatusCanceled, From: store.StatusQueued,
			Error: &store.OperationError{Code: store.LineCancelled, Message: "test"}})
		if err != nil {
			t.Fatalf("ending line %d: %v", line, err)
		}
	}
	return from + n
}

// TestWorkerReadsAnInputFileOnceWhateverItsWindows: a batch whose lines are created a window at
// a time, over many passes, reads its input file about twice in all (validation, then line
// creation), counted by mulligan_batch_input_read_bytes_total; before the input cursor each pass
// read the file again from its first line (here over 20 times).
func TestWorkerReadsAnInputFileOnceWhateverItsWindows(t *testing.T) {
	f := newFixture(t)
	const n, window, step = 200, 20, 10
	var content strings.Builder
	pad := strings.Repeat("x", 8<<10)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&content, `{"custom_id":"req-%d","method":"POST","url":%q,"body":{"pad":%q}}`+"\n", i, chatPath, pad)
	}
	size := content.Len() // 1.6 MB
	b := f.batch(t, "once", content.String(), 24*time.Hour)
	before := inputRead(t)
	w := New(Options{Store: f.st, Lines: f.lines, Clock: f.clock, Log: zaptest.NewLogger(t), Window: window})
	w.Start()
	defer w.Stop()
	next := 1
	for created := window; ; created = min(created+step, n) {
		f.awaitBatch(t, w, b.ID, fmt.Sprint(created, " lines created"), func(b *store.Batch) bool { return b.Created == created })
		if created == n {
			break
		}
		next = f.finishLines(t, b, next, step)
	}
	read := inputRead(t) - before
	// Twice the file, and what the readers buffer ahead (64 KiB each) beyond the last line.
	if limit := float64(2*size + 256<<10); read > limit {
		t.Fatalf("read %.0f bytes of a %d-byte input file over %d windows, want at most %.0f: the file is read again per pass",
			read, size, (n-window)/step+1, limit)
	}
	if read < float64(2*size) {
		t.Fatalf("read %.0f bytes of a %d-byte input file, want at least twice its size (validation, then creation)", read, size)
	}
}

// inputRead is mulligan_batch_input_read_bytes_total now.
func inputRead(t *testing.T) float64 {
	var m dto.Metric
	if err := metrics.inputRead.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestWorkerChunkFitsTheSmallestMemtable: the largest transaction the gateway writes, a chunk
// of 500 lines whose bodies stay in Badger's tree (just under its 1 KiB value threshold), with
// a creator's headers, fits the smallest memtable_size allowed (a transaction must fit in 15 %
// of a memtable, docs/backends.md).
func TestWorkerChunkFitsTheSmallestMemtable(t *testing.T) {
	f := newFixture(t)
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), Now: f.clock.Now, Memory: badger.Memory{MemTableSize: badger.MinMemTableSize}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f.st = st
	var content strings.Builder
	pad := strings.Repeat("x", 550) // with the headers, a request just under the threshold
	for i := 1; i <= lineChunk; i++ {
		fmt.Fprintf(&content, `{"custom_id":"%s-%d","method":"POST","url":%q,"body":{"pad":%q}}`+"\n", strings.Repeat("c", 400), i, chatPath, pad)
	}
	b := f.batch(t, "big", content.String(), 24*time.Hour)
	if _, err := st.UpdateBatch(b.ID, func(b *store.Batch) error {
		b.Template = &store.Request{Host: "gw.example.com", Header: http.Header{"Authorization": {"Bearer " + strings.Repeat("k", 200)},
			"User-Agent": {"OpenAI/JS 5.0"}, "Content-Type": {"application/json"}}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	w := f.worker(nil)
	w.Start()
	defer w.Stop()
	got := f.awaitBatch(t, w, b.ID, "the chunk of 500 lines created", func(b *store.Batch) bool { return b.Created == lineChunk })
	if got.Status != store.BatchInProgress {
		t.Fatalf("batch %s", got.Status)
	}
}

package badger

import (
	"fmt"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// BenchmarkClaimNextAfterManyOperations measures an operation's trip through the queue (accept,
// ClaimNext, succeed) once 50,000 operations have gone through it: their index entries are
// tombstones that a scan of the queue index would walk on every claim; the in-memory FIFO does not.
func BenchmarkClaimNextAfterManyOperations(b *testing.B) {
	st, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	cycle := func(i int) {
		op := &store.Operation{ID: fmt.Sprintf("op_%09d", i), Scope: "s", Status: store.StatusQueued, Retention: time.Hour, SubmittedAt: time.Now()}
		if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
			b.Fatal(err)
		}
		got, err := st.ClaimNext("w", time.Minute)
		if err != nil || got == nil || got.ID != op.ID {
			b.Fatalf("claimed %v, %v; want %s", got, err, op.ID)
		}
		if _, err := st.Transition(got.ID, store.Change{To: store.StatusSucceeded, Holder: "w"}); err != nil {
			b.Fatal(err)
		}
	}
	const before = 50_000
	for i := range before {
		cycle(i)
	}
	b.ResetTimer()
	for i := range b.N {
		cycle(before + i)
	}
	b.StopTimer()
	start := time.Now()
	if _, err := st.OperationsIn(store.StatusQueued); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(time.Since(start).Microseconds()), "µs/scan") // what each claim would cost by scanning
}

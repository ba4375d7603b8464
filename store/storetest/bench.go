package storetest

import (
	"crypto/rand"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// Benchmarks every backend runs the same way, so that their figures compare.

// BenchClaimComplete measures one keyed request's two durable writes (claim, then record),
// 16 writers per CPU sharing st.
func BenchClaimComplete(b *testing.B, st store.Keys) {
	resp := store.Response{Status: 200, Body: make([]byte, 512)}
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		key := make([]byte, 32)
		for pb.Next() {
			_, _ = rand.Read(key)
			c, err := st.ClaimKey(key, key, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if err := st.CompleteKey(key, c.Token, resp, time.Now().Add(time.Hour)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchReplay measures answering a completed key: one read, no write, 16 readers per CPU.
func BenchReplay(b *testing.B, st store.Keys) {
	key := make([]byte, 32)
	c, err := st.ClaimKey(key, key, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	if err := st.CompleteKey(key, c.Token, store.Response{Status: 200, Body: make([]byte, 512)}, time.Now().Add(time.Hour)); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if c, err := st.ClaimKey(key, key, time.Minute); err != nil || c.Outcome != store.Replay {
				b.Fatal(c.Outcome, err)
			}
		}
	})
}

// BenchClaimNextDeepQueues runs BenchClaimNextDeepQueue on a fresh store from open in each
// shape: 10,000 operations in one scope at one urgency (one group head to compare, the cost of
// the FIFO it replaced), across 100 scopes at one urgency (100 heads), and across 100 scopes
// and all eight urgencies (800 heads).
func BenchClaimNextDeepQueues(b *testing.B, open func(b *testing.B) store.Backend) {
	for _, c := range []struct {
		name      string
		scopes, u int
	}{{"1-scope", 1, store.DefaultUrgency}, {"100-scopes", 100, store.DefaultUrgency}, {"100-scopes-8-urgencies", 100, -1}} {
		b.Run(c.name, func(b *testing.B) { BenchClaimNextDeepQueue(b, open(b), c.scopes, c.u) })
	}
}

// BenchClaimNextDeepQueue measures one ClaimNext in the capacity order with 10,000 operations
// queued across scopes scopes, at urgency u (u < 0: each scope's operations spread over all eight
// urgencies). Each claimed operation ends and is replaced, untimed, so the queue stays 10,000
// deep and nothing is left running.
func BenchClaimNextDeepQueue(b *testing.B, st store.Backend, scopes, u int) {
	perScope := 10_000 / scopes
	urgency := func(i int) int {
		if u < 0 {
			return i % (store.LeastUrgent + 1)
		}
		return u
	}
	accept := func(i int) {
		op := &store.Operation{ID: fmt.Sprintf("op_%09d", i), Scope: fmt.Sprintf("scope%03d", i%scopes), Status: store.StatusQueued,
			Version: 1, Urgency: urgency(i / scopes), SubmittedAt: time.Now(), Retention: time.Hour}
		if _, err := st.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil); err != nil {
			b.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < scopes*perScope; i += 16 {
				accept(i)
			}
		})
	}
	wg.Wait()
	b.ResetTimer()
	for i := range b.N {
		op, err := st.ClaimNext("w", time.Minute)
		if err != nil || op == nil {
			b.Fatalf("claim: %v %v", op, err)
		}
		b.StopTimer()
		// The claimed operation ends, as a worker's would: a gateway runs as many as its workers,
		// not every operation it ever claimed (which a claim that counts the runs going on would
		// walk each time).
		if _, err := st.Transition(op.ID, store.Change{To: store.StatusSucceeded, Holder: "w"}); err != nil {
			b.Fatal(err)
		}
		accept(scopes*perScope + i)
		b.StartTimer()
	}
}

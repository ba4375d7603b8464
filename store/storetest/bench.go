package storetest

import (
	"crypto/rand"
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

package store

import (
	"crypto/rand"
	"testing"
	"time"
)

// BenchmarkClaimComplete measures one keyed request's two durable writes, concurrent writers
// sharing fsyncs through the group syncer.
func BenchmarkClaimComplete(b *testing.B) {
	for _, sync := range []bool{false, true} {
		name := map[bool]string{false: "relaxed", true: "sync"}[sync]
		b.Run(name, func(b *testing.B) {
			st, err := Open(Options{Dir: b.TempDir(), Sync: sync})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			resp := Response{Status: 200, Body: make([]byte, 512)}
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
		})
	}
}

// BenchmarkReplay measures answering a completed key: one read, no write.
func BenchmarkReplay(b *testing.B) {
	st, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	key := make([]byte, 32)
	c, _ := st.ClaimKey(key, key, time.Minute)
	_ = st.CompleteKey(key, c.Token, Response{Status: 200, Body: make([]byte, 512)}, time.Now().Add(time.Hour))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if c, err := st.ClaimKey(key, key, time.Minute); err != nil || c.Outcome != Replay {
				b.Fatal(c.Outcome, err)
			}
		}
	})
}

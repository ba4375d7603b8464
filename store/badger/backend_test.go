package badger_test

import (
	"crypto/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

func TestBadgerConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Storage {
		dir := t.TempDir()
		return func(now func() time.Time) store.Backend {
			st, err := badger.Open(badger.Options{Dir: dir, Sync: true, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			return st
		}
	})
}

// BenchmarkClaimComplete measures one keyed request's two durable writes on Badger, with and
// without durability sync: concurrent writers share fsyncs through the group syncer, and
// writes/sync says how many each covered.
func BenchmarkClaimComplete(b *testing.B) {
	for _, sync := range []bool{false, true} {
		b.Run(map[bool]string{false: "relaxed", true: "sync"}[sync], func(b *testing.B) {
			st := openBench(b, sync)
			var syncs, writes atomic.Int64
			st.SetSyncObserver(func(n int) { syncs.Add(1); writes.Add(int64(n)) })
			storetest.BenchClaimComplete(b, st)
			if syncs.Load() > 0 {
				b.ReportMetric(float64(writes.Load())/float64(syncs.Load()), "writes/sync")
			}
		})
	}
}

// BenchmarkReplay measures answering a completed key on Badger: one read, no write. Under
// durability sync the read also checks that what it read is durable (a sync covered it).
func BenchmarkReplay(b *testing.B) {
	for _, sync := range []bool{false, true} {
		b.Run(map[bool]string{false: "relaxed", true: "sync"}[sync], func(b *testing.B) {
			storetest.BenchReplay(b, openBench(b, sync))
		})
	}
}

func openBench(b *testing.B, sync bool) *badger.Store {
	st, err := badger.Open(badger.Options{Dir: b.TempDir(), Sync: sync})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	return st
}

// BenchmarkClaimNextDeepQueue measures a claim in the capacity order with 10,000 operations
// queued, in the shapes of storetest.BenchClaimNextDeepQueues.
func BenchmarkClaimNextDeepQueue(b *testing.B) {
	storetest.BenchClaimNextDeepQueues(b, func(b *testing.B) store.Backend { return openBench(b, false) })
}

// BenchmarkReplayWhileWriting measures BenchmarkReplay's replay under durability sync while 4
// writers record new keys: the replayed key is older than the last sync, so its read never
// waits for one, however many writes are waiting.
func BenchmarkReplayWhileWriting(b *testing.B) {
	st := openBench(b, true)
	stop := make(chan struct{})
	var writers sync.WaitGroup
	for range 4 {
		writers.Go(func() {
			key := make([]byte, 32)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = rand.Read(key)
				c, err := st.ClaimKey(key, key, time.Minute)
				if err == nil {
					_ = st.CompleteKey(key, c.Token, store.Response{Status: 200}, time.Now().Add(time.Hour))
				}
			}
		})
	}
	defer func() { close(stop); writers.Wait() }()
	storetest.BenchReplay(b, st)
}

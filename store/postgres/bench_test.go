package postgres

import (
	"crypto/rand"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

// BenchmarkClaimComplete measures one keyed request's two durable writes (synchronous_commit on
// in the test cluster), as on Badger.
func BenchmarkClaimComplete(b *testing.B) {
	storetest.BenchClaimComplete(b, openTest(b, pgtest.Database(b), Options{MaxConns: 16}))
}

// BenchmarkReplay measures answering a completed key: one read, no write.
func BenchmarkReplay(b *testing.B) {
	storetest.BenchReplay(b, openTest(b, pgtest.Database(b), Options{MaxConns: 16}))
}

// BenchmarkOperationCycle measures an operation's life on the queue: accept, claim by a worker
// (FOR UPDATE SKIP LOCKED among 16 per CPU), succeed with a result.
func BenchmarkOperationCycle(b *testing.B) {
	st := openTest(b, pgtest.Database(b), Options{MaxConns: 16})
	var n atomic.Int64
	req := &store.Request{Method: "POST", URL: "/v1/x", Body: make([]byte, 512)}
	res := &store.Response{Status: 200, Body: make([]byte, 512)}
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		worker := fmt.Sprintf("w%d", n.Add(1))
		for pb.Next() {
			id := fmt.Sprintf("op_%012d", n.Add(1))
			op := &store.Operation{ID: id, Scope: "s", Status: store.StatusQueued, Retention: time.Hour, SubmittedAt: time.Now()}
			if _, err := st.AcceptOperation(op, req, nil); err != nil {
				b.Fatal(err)
			}
			got, err := st.ClaimNext(worker, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if got == nil {
				continue // every queued operation was being claimed by the others
			}
			if _, err := st.Transition(got.ID, store.Change{To: store.StatusSucceeded, Result: res, Holder: worker}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAccept measures accepting a keyed operation: the operation, its request and the
// key's 202 in one transaction.
func BenchmarkAccept(b *testing.B) {
	st := openTest(b, pgtest.Database(b), Options{MaxConns: 16})
	var n atomic.Int64
	req := &store.Request{Method: "POST", URL: "/v1/x", Body: make([]byte, 512)}
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		key := make([]byte, 32)
		for pb.Next() {
			_, _ = rand.Read(key)
			id := fmt.Sprintf("op_%012d", n.Add(1))
			op := &store.Operation{ID: id, Scope: "s", Status: store.StatusQueued, Retention: time.Hour, SubmittedAt: time.Now()}
			k := &store.KeyAccept{Key: key, Fingerprint: key, Response: store.Response{Status: 202}, Expires: time.Now().Add(time.Hour)}
			if c, err := st.AcceptOperation(op, req, k); err != nil || c.Outcome != store.Claimed {
				b.Fatal(c.Outcome, err)
			}
		}
	})
}

// BenchmarkAppendEvents measures recording a stream: one batch of 10 events of 400 bytes per
// op, appended to one live stream, as the appender does while a stream is relayed.
func BenchmarkAppendEvents(b *testing.B) {
	st := openTest(b, pgtest.Database(b), Options{})
	key := []byte("stream")
	c, err := st.ClaimKey(key, key, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	if err := st.BeginStream(key, store.KeyHolder(c.Token), 200, nil, 2*time.Hour); err != nil {
		b.Fatal(err)
	}
	batch := make([]store.StreamEvent, 10)
	for i := range batch {
		batch[i] = store.StreamEvent{ID: fmt.Sprint(i), Data: make([]byte, 400)}
	}
	b.SetBytes(int64(len(batch) * 400))
	for b.Loop() {
		if err := st.AppendEvents(key, store.KeyHolder(c.Token), batch); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimNextDeepQueue measures a claim in the capacity order with 10,000 operations
// queued, in the shapes of storetest.BenchClaimNextDeepQueues.
func BenchmarkClaimNextDeepQueue(b *testing.B) {
	storetest.BenchClaimNextDeepQueues(b, func(b *testing.B) store.Backend { return openTest(b, pgtest.Database(b), Options{MaxConns: 16}) })
}

// BenchmarkExecModes measures a keyed request's two writes, as BenchmarkClaimComplete, in each
// of pgx's statement modes on a direct connection: cache_statement (the default there),
// cache_describe (what the store uses through a pooler: pooler.go) and exec (no cache at all).
// docs/backends.md cites the figures.
func BenchmarkExecModes(b *testing.B) {
	for _, mode := range []string{"cache_statement", "cache_describe", "exec"} {
		b.Run(mode, func(b *testing.B) {
			dsn := pgtest.Database(b)
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			storetest.BenchClaimComplete(b, openTest(b, dsn+sep+"default_query_exec_mode="+mode, Options{MaxConns: 16}))
		})
	}
}

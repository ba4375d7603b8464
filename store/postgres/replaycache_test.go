package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

func listening(st *Store) bool {
	st.replays.mu.Lock()
	defer st.replays.mu.Unlock()
	return st.replays.listening
}

// completed records key on st with a body naming it, fingerprint fp.
func completed(t *testing.T, st *Store, key, fp []byte, expires time.Time) {
	t.Helper()
	c, err := st.ClaimKey(key, fp, time.Minute)
	if err != nil || c.Outcome != store.Claimed {
		t.Fatalf("claim: %v, %v", c.Outcome, err)
	}
	if err := st.CompleteKey(key, c.Token, store.Response{Status: 200, Body: key}, expires); err != nil {
		t.Fatal(err)
	}
}

func claimOutcome(t *testing.T, st *Store, key, fp []byte) store.ClaimOutcome {
	t.Helper()
	c, err := st.ClaimKey(key, fp, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return c.Outcome
}

func TestEvictionOnOneReplicaEndsReplaysOnEveryOther(t *testing.T) {
	dsn := pgtest.Database(t)
	a := openTest(t, dsn, Options{ReplayCacheFor: time.Hour}) // only the notice can end the replays
	counter := &statementCounter{}
	b := openTest(t, dsn, Options{ReplayCacheFor: time.Hour, tracer: counter})
	testkit.WaitFor(t, 5*time.Second, "the replicas listen", func() bool { return listening(a) && listening(b) })
	key, fp := []byte("key"), []byte("fp")
	completed(t, a, key, fp, time.Now().Add(time.Hour))
	if got := claimOutcome(t, b, key, fp); got != store.Replay {
		t.Fatalf("replica b: %v, want a replay", got)
	}
	if sql := counter.during(func() {
		if got := claimOutcome(t, b, key, fp); got != store.Replay {
			t.Fatalf("replica b again: %v, want a replay", got)
		}
		if got := claimOutcome(t, b, key, []byte("other")); got != store.Mismatch {
			t.Fatalf("replica b, another payload: %v, want a mismatch", got)
		}
	}); len(sql) != 0 {
		t.Fatalf("replays from the cache sent %q", sql)
	}

	if found, err := a.EvictKey(key); err != nil || !found {
		t.Fatalf("evict: %v, %v", found, err)
	}
	testkit.WaitFor(t, 5*time.Second, "replica b hears of the eviction", func() bool { return b.replays.get(key, time.Now()) == nil })
	if got := claimOutcome(t, b, key, fp); got != store.Claimed {
		t.Fatalf("replica b after the eviction on a: %v, want the key claimed anew", got)
	}
}

func TestLostEvictionNoticeIsBoundedByReplayCacheFor(t *testing.T) {
	dsn := pgtest.Database(t)
	clock := storetest.NewClock()
	st := openTest(t, dsn, Options{Now: clock.Now, ReplayCacheFor: 5 * time.Second})
	testkit.WaitFor(t, 5*time.Second, "the replica listens", func() bool { return listening(st) })
	key, fp := []byte("key"), []byte("fp")
	completed(t, st, key, fp, clock.Now().Add(time.Hour))
	if got := claimOutcome(t, st, key, fp); got != store.Replay {
		t.Fatalf("%v, want a replay", got)
	}
	// The row goes without a notice, as when the notice of an eviction is lost.
	if _, err := st.pool.Exec(context.Background(), `DELETE FROM idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	clock.Advance(5*time.Second - time.Millisecond)
	if got := claimOutcome(t, st, key, fp); got != store.Replay {
		t.Fatalf("within ReplayCacheFor: %v, want the cached replay", got)
	}
	clock.Advance(time.Millisecond)
	if got := claimOutcome(t, st, key, fp); got != store.Claimed {
		t.Fatalf("after ReplayCacheFor: %v, want the key claimed anew", got)
	}
}

func TestListenerReconnectEmptiesTheReplayCache(t *testing.T) {
	st := openTest(t, pgtest.Database(t), Options{ReplayCacheFor: time.Hour})
	testkit.WaitFor(t, 5*time.Second, "the replica listens", func() bool { return listening(st) })
	key := []byte("key")
	completed(t, st, key, key, time.Now().Add(time.Hour))
	claimOutcome(t, st, key, key)
	if st.replays.get(key, time.Now()) == nil {
		t.Fatal("the replay was not cached")
	}
	// Notices sent while the listener is away are lost: the cache must not outlive it.
	if _, err := st.pool.Exec(context.Background(),
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "the cache empties", func() bool { return st.replays.get(key, time.Now()) == nil })
	testkit.WaitFor(t, 10*time.Second, "the listener is back", func() bool { return listening(st) })
	claimOutcome(t, st, key, key)
	if st.replays.get(key, time.Now()) == nil {
		t.Fatal("the replay was not cached once the listener was back")
	}
}

func TestReplayCacheIsBoundedBySizeAndExpiry(t *testing.T) {
	now := time.Now()
	c := newReplayCache(64<<10, time.Hour)
	c.reset(true)
	rec := func(expires time.Time) *store.Record {
		return &store.Record{State: store.Completed, ExpiresAt: expires, Response: &store.Response{Status: 200, Body: make([]byte, 1000)}}
	}
	for i := range 200 {
		c.put(fmt.Appendf(nil, "k%d", i), rec(now.Add(time.Hour)), c.generation(), now)
	}
	if c.bytes > c.maxBytes || c.get([]byte("k0"), now) != nil || c.get([]byte("k199"), now) == nil {
		t.Fatalf("%d bytes for a bound of %d; the oldest must go first", c.bytes, c.maxBytes)
	}
	c.put([]byte("big"), &store.Record{State: store.Completed, ExpiresAt: now.Add(time.Hour),
		Response: &store.Response{Body: make([]byte, 8<<10)}}, c.generation(), now)
	if c.get([]byte("big"), now) != nil {
		t.Fatal("a record of an eighth of the cache was kept")
	}
	c.put([]byte("soon"), rec(now.Add(time.Second)), c.generation(), now)
	if c.get([]byte("soon"), now) == nil || c.get([]byte("soon"), now.Add(time.Second)) != nil {
		t.Fatal("a cached record must replay until its expiry and not after")
	}
	gen := c.generation()
	c.heard("6b31393900") // another key's eviction, heard while a read was under way
	c.put([]byte("read"), rec(now.Add(time.Hour)), gen, now)
	if c.get([]byte("read"), now) != nil {
		t.Fatal("a record read while a notice came was kept")
	}
	c.put([]byte("streamed"), &store.Record{State: store.Completed, Streamed: true, ExpiresAt: now.Add(time.Hour), Response: &store.Response{}}, c.generation(), now)
	c.put([]byte("held"), &store.Record{State: store.InFlight, LeaseUntil: now.Add(time.Hour), Response: &store.Response{}}, c.generation(), now)
	if c.get([]byte("streamed"), now) != nil || c.get([]byte("held"), now) != nil {
		t.Fatal("only completed records replayed from their row are cached")
	}
}

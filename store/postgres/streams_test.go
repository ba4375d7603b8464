package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

// A record completed with a recorded stream replays that stream only while nothing else has
// written its row: a later write by any version of the gateway (here one that knows nothing of
// streams and completes the key with a JSON answer) unbinds the stream from it.
func TestStreamedRecordIsUnboundByAnyLaterWrite(t *testing.T) {
	st := openTest(t, pgtest.Database(t), Options{})
	key := []byte("k")
	c, err := st.ClaimKey(key, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_ = st.BeginStream(key, store.KeyHolder(c.Token), 200, nil, time.Hour)
	_ = st.AppendEvents(key, store.KeyHolder(c.Token), []store.StreamEvent{{ID: "1", Data: []byte("data: a\n\n")}})
	if err := st.FinishStream(key, store.KeyHolder(c.Token), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if rec, err := st.LookupKey(key); err != nil || rec == nil || !rec.Streamed {
		t.Fatalf("after FinishStream: %+v, %v", rec, err)
	}
	// The previous version's CompleteKey after its own claim of the key: it bumps rev and
	// writes its answer, and leaves the column it does not know alone.
	if _, err := st.pool.Exec(context.Background(), `UPDATE idempotency_keys SET rev = rev + 1,
		response_status = 200, response_header = NULL, response_body = '{"ok":true}' WHERE key = $1`, key); err != nil {
		t.Fatal(err)
	}
	rec, err := st.LookupKey(key)
	if err != nil || rec == nil || rec.Streamed || string(rec.Response.Body) != `{"ok":true}` {
		t.Fatalf("after another write the record still replays the stream: %+v, %v", rec, err)
	}
}

// The sweep re-checks a row it waited for: a key whose old record was past its purge time, and
// which a claim rewrote while the sweep waited for the row, is not deleted under that claim.
func TestSweepLeavesARowRewrittenWhileItWaited(t *testing.T) {
	dsn := pgtest.Database(t)
	clock := storetest.NewClock()
	st := openTest(t, dsn, Options{Now: clock.Now})
	key := []byte("k")
	if _, err := st.ClaimKey(key, []byte("fp"), time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(claimKeptFor + time.Minute) // the claim is past its purge time
	ctx := context.Background()
	tx, err := st.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// A new claim of the key, not yet committed: the sweep will wait for its row.
	if _, err := tx.Exec(ctx, `UPDATE idempotency_keys SET rev = rev + 1, token = 'new', lease_until = $2, purge_at = $2
		WHERE key = $1`, key, clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	swept := make(chan SweepStats, 1)
	go func() {
		got, err := st.Sweep()
		if err != nil {
			t.Error(err)
		}
		swept <- got
	}()
	testkit.WaitFor(t, 10*time.Second, "the sweep waiting for the row", func() bool {
		return count(t, st, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-swept; got.Keys != 0 {
		t.Fatalf("the sweep deleted %d keys", got.Keys)
	}
	if n := count(t, st, `SELECT count(*) FROM idempotency_keys WHERE token = 'new'`); n != 1 {
		t.Fatalf("the claim made while the sweep waited is gone (%d rows)", n)
	}
}

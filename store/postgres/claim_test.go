package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

// A claim gives its scope the latest turn, in the claim's one statement: a lone scope's claims
// move its turn on, and scopes that take turns alternate, a scope never served first
// (docs/backends.md, "The capacity order").
func TestClaimGivesItsScopeTheLatestTurn(t *testing.T) {
	clock := storetest.NewClock()
	st := replicas(t, 1, clock)[0]
	n := 0
	accept := func(scope string) {
		n++
		op := &store.Operation{ID: fmt.Sprintf("op_%02d", n), Scope: scope, Status: store.StatusQueued, Version: 1,
			SubmittedAt: clock.Now(), Retention: time.Hour}
		if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	claim := func() string {
		op, err := st.ClaimNext("w", time.Minute)
		if err != nil || op == nil {
			t.Fatalf("claimed %v, %v", op, err)
		}
		return op.Scope
	}
	turn := func(scope string) int {
		return count(t, st, `SELECT coalesce((SELECT turn FROM queue_lanes WHERE lane = '`+scope+`'), 0)`)
	}
	handedOut := func() int { return count(t, st, `SELECT last_value FROM queue_turn_seq WHERE is_called`) }

	for range 3 {
		accept("a")
	}
	claim()
	first := turn("a")
	if first == 0 {
		t.Fatal("the first claim of scope a gave it no turn")
	}
	claim()
	claim()
	if turn("a") <= first || handedOut() != turn("a") {
		t.Fatalf("a lone scope's claims left its turn at %d (first %d), sequence at %d", turn("a"), first, handedOut())
	}

	accept("b")
	accept("a")
	accept("b")
	accept("a")
	var order []string
	for range 4 {
		order = append(order, claim())
	}
	if want := []string{"b", "a", "b", "a"}; !slices.Equal(order, want) {
		t.Fatalf("claimed scopes %v, want %v", order, want)
	}
	if turn("a") <= turn("b") || turn("b") <= first {
		t.Fatalf("turns a %d, b %d after alternating (a's first %d)", turn("a"), turn("b"), first)
	}
}

// A claim reads a row per (lane, urgency, lift) group, not the queue: against 30,000 queued
// operations of a few lanes, some asking more urgency for their own work, the claim (ClaimNext)
// and the claim by id (ClaimQueued's look, with its lane's oldest work) walk the claim's index
// and filter out next to nothing; they then claim what the order says.
func TestClaimReadsTheGroupsHeadsNotTheQueue(t *testing.T) {
	dsn := pgtest.Database(t)
	st := openTest(t, dsn, Options{})
	ctx := context.Background()
	now := time.Now()
	if _, err := st.pool.Exec(ctx, `INSERT INTO operations (id, scope, status, doc, urgency, submitted_at, lane, lift)
		SELECT 'op_' || lpad(i::text, 8, '0'), 's' || (i % 4), 'queued',
			convert_to('{"id":"op_' || lpad(i::text, 8, '0') || '","status":"queued","urgency":3}', 'UTF8'),
			CASE WHEN i % 10 = 0 THEN 7 ELSE 3 END, $1::timestamptz - interval '1 second' + i * interval '1 microsecond',
			CASE WHEN i % 4 = 0 THEN 'key:big' END, CASE WHEN i % 1000 = 7 THEN 3 ELSE 0 END
		FROM generate_series(1, 30000) i`, now); err != nil {
		t.Fatal(err)
	}
	if _, err := st.pool.Exec(ctx, `ANALYZE operations`); err != nil {
		t.Fatal(err)
	}
	explain := func(name, sql string, args ...any) {
		t.Helper()
		if text, read := explainAnalyze(t, st, sql, args...); read > 100 || strings.Contains(text, "Seq Scan on operations") || !strings.Contains(text, "operations_queued_own") {
			t.Errorf("%s read %d rows it filtered out, or not by the claim's index:\n%s", name, read, text)
		}
	}
	explain("the claim", nextInOrderSQL, now, agingStep, []string{})
	explain("the claim by id", `SELECT `+opColumns+`, `+laneArrivalSQL+` FROM operations x WHERE x.id = $3 AND `+
		strings.ReplaceAll(claimable, "o.", "x.")+` FOR UPDATE OF x SKIP LOCKED`, now, agingStep, "op_00012007")
	// The lanes take turns, newcomers oldest first (s1, s2), s1 known then ahead of the newcomers'
	// turn; s3's claim is its work that asked u=0 (lift 3), op 7, not its oldest, op 3.
	var got []string
	for range 4 {
		op, err := st.ClaimNext("w1", time.Minute)
		if err != nil || op == nil {
			t.Fatalf("claim: %v %v", op, err)
		}
		got = append(got, op.ID)
	}
	if want := []string{"op_00000001", "op_00000002", "op_00000005", "op_00000007"}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
}

package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// Reading a page deep in a long stream finds its first segment by index: the rows PostgreSQL
// looks at do not grow with the segments before the page (docs/streams.md).
func TestDeepPageOfALongStreamReadsOnlyItsSegments(t *testing.T) {
	st := openTest(t, pgtest.Database(t), Options{})
	key := []byte("long")
	c, err := st.ClaimKey(key, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.BeginStream(key, store.KeyHolder(c.Token), 200, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	const segments = 20000
	ctx := context.Background()
	seg := store.EncodeSegment(nil, []store.StreamEvent{{ID: "x", Data: []byte("data: x\n\n")}})
	if _, err := st.pool.Exec(ctx, `INSERT INTO stream_segments (key, token, first_seq, last_seq, data)
		SELECT $1, $2, n, n, $3 FROM generate_series(1, $4::bigint) AS n`, key, c.Token, seg, segments); err != nil {
		t.Fatal(err)
	}
	if _, err := st.pool.Exec(ctx, `UPDATE stream_heads SET events = $2 WHERE key = $1`, key, segments); err != nil {
		t.Fatal(err)
	}
	if _, err := st.pool.Exec(ctx, `ANALYZE stream_segments`); err != nil {
		t.Fatal(err)
	}
	if p, err := st.ReadEvents(key, segments-10, 5); err != nil || len(p.List) != 5 || p.List[0].Seq != segments-9 {
		t.Fatalf("page after %d: %v, %+v", segments-10, err, p.List)
	}
	var plan []map[string]any
	err = st.pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+readEventsSQL, key, time.Now(), segments-10, 5).Scan(&plan)
	if err != nil {
		t.Fatal(err)
	}
	looked := rowsLookedAt(plan[0]["Plan"].(map[string]any))
	t.Logf("a page of 5 events after %d of %d segments looked at %.0f rows", segments-10, segments, looked)
	if looked > 100 {
		raw, _ := json.MarshalIndent(plan, "", " ")
		t.Fatalf("a page of 5 events after %d looked at %.0f rows:\n%s", segments-10, looked, raw)
	}
}

// rowsLookedAt sums, over a plan's nodes, the rows each returned and removed by its filters.
func rowsLookedAt(node map[string]any) float64 {
	n := 0.0
	for _, k := range []string{"Actual Rows", "Rows Removed by Filter", "Rows Removed by Index Recheck"} {
		if v, ok := node[k].(float64); ok {
			loops, _ := node["Actual Loops"].(float64)
			n += v * max(loops, 1)
		}
	}
	children, _ := node["Plans"].([]any)
	for _, c := range children {
		n += rowsLookedAt(c.(map[string]any))
	}
	return n
}

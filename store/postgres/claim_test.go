package postgres

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
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

package store

import (
	"encoding/json"
	"testing"
	"time"
)

func TestOperationStoredWithoutUrgencyReadsAsTheDefault(t *testing.T) {
	var old, set Operation
	if err := json.Unmarshal([]byte(`{"id":"op_1","status":"queued"}`), &old); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"id":"op_2","status":"queued","urgency":0}`), &set); err != nil {
		t.Fatal(err)
	}
	if old.Urgency != DefaultUrgency || old.ID != "op_1" || set.Urgency != 0 {
		t.Fatalf("without urgency %d (want %d), with urgency 0: %d", old.Urgency, DefaultUrgency, set.Urgency)
	}
}

// A run's end corrects its lane's turn by what it cost beyond its claim's charge, over the
// lane's weight: a longer run moves the turn on, a shorter one refunds it, no earlier than the
// virtual time; a requeue by its worker ends a run as a finish does, timed from its start; a
// takeover ends none.
func TestARunsEndCorrectsItsTurn(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	op := &Operation{Scope: "s", Status: StatusRunning, StartedAt: at, Weight: 2, Charged: DefaultHold, ChargedBand: 4,
		ChargedNewcomer: true, NewcomersCharged: DefaultHold}
	if _, ok := RunOf(op, Change{To: StatusRunning}, at); ok {
		t.Fatal("a change that stays running ended a run")
	}
	if _, ok := RunOf(op, Change{To: StatusQueued, Holder: "w", LeaseExpired: true}, at.Add(time.Hour)); ok {
		t.Fatal("a takeover an hour on ended a run")
	}
	r, ok := RunOf(op, Change{To: StatusQueued}, at.Add(3*time.Second))
	if !ok || r.Took != 3_000_000 || r.Lane != "s" || r.Band != 3 || !r.InBand() {
		t.Fatalf("requeued after 3 s: %+v %v", r, ok)
	}
	if d := r.Delta(); d != 1_000_000 {
		t.Fatalf("3 s charged 1 s at weight 2: delta %d, want 1 s", d)
	}
	if d := r.NewcomersDelta(); d != 2_000_000 {
		t.Fatalf("the newcomers' delta %d, want 2 s (weight 1)", d)
	}
	if o := Overrun(at, DefaultHold, at.Add(3*time.Second)); o != 2_000_000 {
		t.Fatalf("3 s into a run charged 1 s: overrun %d", o)
	}
	r.Took = 0 // never reached the upstream: refunded down to the least a claim costs
	if d := r.Delta(); d != (MinCharge-DefaultHold)/2 {
		t.Fatalf("refund %d", d)
	}
	if got := SettledTurn(5_000_000, -4_000_000, 3_000_000); got != 3_000_000 {
		t.Fatalf("a refund took the turn to %d, below the virtual time", got)
	}
	if got := SettledTurn(2_000_000, -1_000_000, 3_000_000); got != 2_000_000 {
		t.Fatalf("a refund of a turn behind the virtual time moved it to %d", got)
	}
	r.Charged = 0
	if r.Delta() != 0 || r.NewcomersDelta() != 0 {
		t.Fatal("a run its claim charged nothing for corrected a turn")
	}
	if got := MovedHold(100, 10_000); got != 100+(1000-100)/5 {
		t.Fatalf("one long run moved the average to %d; it counts as ten times the average at most", got)
	}
	if got := ClaimCharge(2000, 5000); got != 2000 {
		t.Fatalf("a lane of short runs was charged %d, not its own average", got)
	}
	if got := ClaimCharge(0, 0); got != DefaultHold {
		t.Fatalf("a claim with nothing measured was charged %d", got)
	}
	if got := TurnIn(9_000, false, 100); got != 100 {
		t.Fatalf("a lane charged in another band stands at %d in one at 100", got)
	}
	if got := TurnIn(9_000, true, 100); got != 9_000 {
		t.Fatalf("a lane's turn in its own band read %d", got)
	}
	if got := NewcomersTurn(1_000_000_000, 0, 0, 1000); got != 10*1000 {
		t.Fatalf("the newcomers' turn far ahead read %d; want capped at ten claims", got)
	}
}

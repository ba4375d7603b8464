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

// A claim moves a lane's turn on to now (or just after the latest turn given), never back from
// where a charge put it; a charge is the share of the upstream's time times the lanes with work,
// over the weight.
func TestClaimTurnKeepsAChargedTurnAndChargeTurnScalesByLanesAndWeight(t *testing.T) {
	now := time.UnixMicro(1_000_000)
	if turn, _, advanced := ClaimTurn(500, 0, 1, now, 0); !advanced || turn != 1_000_000 {
		t.Fatalf("an old turn claimed at now: %d, %v; want now, advanced", turn, advanced)
	}
	if turn, _, _ := ClaimTurn(1_000_050, 0, 1, now, 1_000_000); turn != 1_000_050 {
		t.Fatalf("just after the latest turn: %d; want 1000050 kept", turn)
	}
	if turn, _, _ := ClaimTurn(3_000_000, 0, 1, now, 0); turn != 3_000_000 {
		t.Fatalf("a charged turn ahead of now was moved back to %d", turn)
	}
	if turn, credit, advanced := ClaimTurn(3_000_000, 0, 2, now, 0); advanced || turn != 3_000_000 || credit != 1 {
		t.Fatalf("weight 2's first claim: %d, %v, %v; want the turn kept and one claim counted", turn, credit, advanced)
	}
	for _, c := range []struct {
		share time.Duration
		lanes int
		w     float64
		want  int64
	}{
		{100 * time.Millisecond, 1, 1, 100_000},
		{100 * time.Millisecond, 3, 1, 300_000},
		{100 * time.Millisecond, 3, 2, 150_000},
		{100 * time.Millisecond, 0, 0, 100_000},                // no lane counted, no weight: one each
		{-time.Second, 2, 1, 0},                                // a clock stepped back charges nothing
		{time.Second, 1, 2 * MaxWeight, 1_000_000 / MaxWeight}, // the weight is bounded
	} {
		if got := ChargeTurn(0, c.share, c.lanes, c.w); got != c.want {
			t.Errorf("ChargeTurn(0, %v, %d, %v) = %d; want %d", c.share, c.lanes, c.w, got, c.want)
		}
	}
}

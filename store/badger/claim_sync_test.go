package badger

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// A claim waits for an fsync of its own only where a crash must fail the operation (on_crash
// fail); under requeue the final write's fsync covers it (store.ClaimMustBeDurable).
func TestClaimWaitsForAnFsyncOnlyUnderOnCrashFail(t *testing.T) {
	st := openTemp(t, true)
	var syncs atomic.Int64
	st.SetSyncObserver(func(int) { syncs.Add(1) })
	for _, c := range []struct {
		onCrash string
		synced  bool
	}{{"", false}, {"requeue", false}, {"fail", true}} {
		op := &store.Operation{ID: "op_" + c.onCrash, Scope: "s", Status: store.StatusQueued, Retention: time.Hour, SubmittedAt: time.Now(),
			Exec: &store.Execution{OnCrash: c.onCrash}}
		if _, err := st.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil); err != nil {
			t.Fatal(err)
		}
		before := syncs.Load()
		claimed, err := st.ClaimNext("w", time.Minute)
		if err != nil || claimed == nil || claimed.ID != op.ID {
			t.Fatalf("claimed %v, %v; want %s", claimed, err, op.ID)
		}
		if synced := syncs.Load() > before; synced != c.synced {
			t.Errorf("on_crash %q: the claim waited for an fsync: %v, want %v", c.onCrash, synced, c.synced)
		}
		if _, err := st.Transition(op.ID, store.Change{To: store.StatusSucceeded, Holder: "w"}); err != nil {
			t.Fatal(err)
		}
	}
}

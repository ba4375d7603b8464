package badger

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// A claim waits for an fsync of its own only where a crash must fail the operation (on_crash
// fail) or a receiver hears of its start (operation.running); otherwise the final write's fsync
// covers it (store.ClaimMustBeDurable).
func TestClaimWaitsForAnFsyncOnlyUnderOnCrashFail(t *testing.T) {
	st := openTemp(t, true)
	var syncs atomic.Int64
	st.SetSyncObserver(func(int) { syncs.Add(1) })
	for i, c := range []struct {
		onCrash string
		events  []string
		synced  bool
	}{
		{"", nil, false},
		{"requeue", []string{"operation.succeeded"}, false},
		{"fail", nil, true},
		{"requeue", []string{"operation.running", "operation.succeeded"}, true},
	} {
		op := &store.Operation{ID: fmt.Sprint("op_", i), Scope: "s", Status: store.StatusQueued, Retention: time.Hour, SubmittedAt: time.Now(),
			Exec: &store.Execution{OnCrash: c.onCrash, Events: c.events}}
		if _, err := st.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil); err != nil {
			t.Fatal(err)
		}
		before := syncs.Load()
		claimed, err := st.ClaimNext("w", time.Minute)
		if err != nil || claimed == nil || claimed.ID != op.ID {
			t.Fatalf("claimed %v, %v; want %s", claimed, err, op.ID)
		}
		if synced := syncs.Load() > before; synced != c.synced {
			t.Errorf("on_crash %q, events %v: the claim waited for an fsync: %v, want %v", c.onCrash, c.events, synced, c.synced)
		}
		if _, err := st.Transition(op.ID, store.Change{To: store.StatusSucceeded, Holder: "w"}); err != nil {
			t.Fatal(err)
		}
	}
}

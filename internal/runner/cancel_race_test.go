package runner

import (
	"errors"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/internal/reqlog"
	"github.com/mulligan-gw/mulligan/store"
)

// A cancel that read the operation queued, when a runner claims it before the cancel is
// written, must not cancel it as a queued one: it fails ErrIllegalTransition, the operation
// stays running (the caller then cuts it as a running one), and the queued count is not
// lowered a second time.
func TestCancelQueuedLosesToAClaimInBetween(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lr := newLoopRunner(t, clock, answerOK, Config{})
	lr.Accept(t, "op_raced", testExecution(0, 0), nil, `{}`)
	read, err := lr.st.GetOperation("op_raced")
	if err != nil || read.Status != store.StatusQueued {
		t.Fatalf("read %+v %v", read, err)
	}
	if got, err := lr.st.ClaimNext("another-worker", DefaultTakeover); err != nil || got == nil || got.ID != "op_raced" {
		t.Fatalf("claim: %+v %v", got, err)
	}
	lr.queued.Add(-1) // as the claiming runner counts it
	before := lr.queued.Load()
	if _, err := lr.CancelQueued(read, reqlog.New(lr.log)); !errors.Is(err, store.ErrIllegalTransition) {
		t.Fatalf("cancelQueued of a claimed operation: %v, want ErrIllegalTransition", err)
	}
	if op, _ := lr.st.GetOperation("op_raced"); op.Status != store.StatusRunning {
		t.Fatalf("the claimed operation is %s, want running", op.Status)
	}
	if after := lr.queued.Load(); after != before {
		t.Fatalf("the queued count went from %d to %d", before, after)
	}
}

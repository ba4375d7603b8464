package badger

import (
	"fmt"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// A scope-limited accept holds its scope's lock, then its operation's. Both came from one set
// of 256 striped locks, so one accept in 256 whose scope and id hashed to one stripe locked
// itself forever (CI hung in the behaviour suite). 1,000 accepts meet that stripe almost surely.
func TestScopeLimitedAcceptsNeverLockThemselves(t *testing.T) {
	st, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	done := make(chan error, 1)
	go func() {
		for i := range 1000 {
			op := &store.Operation{ID: fmt.Sprintf("op_%04d", i), Scope: "s", Status: store.StatusQueued, Version: 1,
				Method: "POST", Path: "/v1/x", SubmittedAt: time.Now(), Retention: time.Hour,
				Urgency: store.DefaultUrgency, ScopeLimit: 100000}
			if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("accepts under a scope limit stopped: an accept waits for a lock it holds")
	}
}

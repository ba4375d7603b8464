package storetest

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
)

// SyncHold holds a backend's next durability sync open, so that a case can read while a write
// is committed and not yet durable (RunDurableReads).
type SyncHold struct {
	// Hold makes the next sync wait until release is called; held is closed once one waits.
	Hold func() (held <-chan struct{}, release func())
	// Waiting is how many calls wait for a sync that has not started yet.
	Waiting func() int
}

// RunDurableReads runs the cases of what a reader sees of a write whose sync is held open:
// nothing, until the sync is done (docs/backends.md, "What a reader sees"). fresh returns a
// durable handle on a new storage and the hold of its syncs. A backend whose commits become
// visible only once durable (PostgreSQL with synchronous_commit on) has no such window, and
// nothing to hold.
func RunDurableReads(t *testing.T, fresh func(t *testing.T, now func() time.Time) (store.Backend, SyncHold)) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, e *env, b store.Backend, h SyncHold)
	}{
		{"AFinalStatusItsResultAndItsEventAreReadOnlyOnceDurable", testFinalReadOnceDurable},
		{"ARunningEventIsHandedOutOnlyOnceItsClaimIsDurable", testRunningEventOnceDurable},
		{"ARecordedResponseReplaysOnlyOnceDurable", testReplayOnceDurable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := &env{clock: NewClock()}
			b, h := fresh(t, e.clock.Now)
			tc.fn(t, e, b, h)
		})
	}
}

// whileHeld runs write with the next sync held, then each read while the write waits for it:
// every read must wait too, and once the sync is released, see the write (check).
func whileHeld(t *testing.T, h SyncHold, write func() error, reads map[string]func() error) {
	t.Helper()
	held, release := h.Hold()
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	wrote := make(chan error, 1)
	go func() { wrote <- write() }()
	select {
	case <-held:
	case err := <-wrote:
		t.Fatalf("the write returned before its sync: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no sync began for the write")
	}
	done := make(chan string, len(reads))
	errs := map[string]chan error{}
	for name, read := range reads {
		ch := make(chan error, 1)
		errs[name] = ch
		go func() { ch <- read(); done <- name }()
	}
	testkit.WaitFor(t, 10*time.Second, "the reads to wait for the write's sync", func() bool {
		select {
		case name := <-done:
			t.Fatalf("%s answered while the write it read was not durable yet: %v", name, <-errs[name])
		default:
		}
		return h.Waiting() >= len(reads)
	})
	released = true
	release()
	if err := <-wrote; err != nil {
		t.Fatalf("the write: %v", err)
	}
	for name := range reads {
		if err := <-errs[name]; err != nil {
			t.Errorf("%s, once the sync was done: %v", name, err)
		}
	}
}

func testFinalReadOnceDurable(t *testing.T, e *env, b store.Backend, h SyncHold) {
	b.SetAnnouncer(e.announcer())
	e.accept(t, b, "s", 0, 1)
	must(b.ClaimNext("w", time.Minute))(t)
	body := []byte("the answer")
	whileHeld(t, h, func() error {
		_, err := b.Transition(opID(0), store.Change{To: store.StatusSucceeded, Holder: "w", Result: &store.Response{Status: 200, Body: body}})
		return err
	}, map[string]func() error{
		"GetOperation": func() error {
			op, err := b.GetOperation(opID(0))
			if err == nil && op.Status != store.StatusSucceeded {
				err = fmt.Errorf("status %s", op.Status)
			}
			return err
		},
		"LoadResult": func() error {
			res, err := b.LoadResult(opID(0))
			if err == nil && !bytes.Equal(res.Body, body) {
				err = fmt.Errorf("result %q", res.Body)
			}
			return err
		},
		"DueEvents": func() error {
			due, err := b.DueEvents(time.Time{}, e.clock.Now(), 10)
			if err == nil && (len(due) != 1 || due[0].ID != "evt_"+opID(0)) {
				err = fmt.Errorf("due %+v", due)
			}
			return err
		},
		"ListOperations": func() error {
			ops, _, err := b.ListOperations("s", store.StatusSucceeded, "", 10)
			if err == nil && len(ops) != 1 {
				err = fmt.Errorf("listed %v", ids(ops))
			}
			return err
		},
	})
}

func testRunningEventOnceDurable(t *testing.T, e *env, b store.Backend, h SyncHold) {
	b.SetAnnouncer(func(op *store.Operation, _ *store.Response) *store.Event {
		if op.Status != store.StatusRunning {
			return nil
		}
		return &store.Event{ID: "evt_" + op.ID, Type: "operation.running", OperationID: op.ID, Version: op.Version,
			Endpoint: "e", URL: "https://receiver.example.com/hook", OccurredAt: e.clock.Now(), Operation: []byte(`{}`)}
	})
	op := e.newOp(0, "s")
	op.Exec = &store.Execution{Events: []string{"operation.running"}} // its claim must be durable (store.ClaimMustBeDurable)
	must(b.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil))(t)
	whileHeld(t, h, func() error {
		got, err := b.ClaimNext("w", time.Minute)
		if err == nil && (got == nil || got.ID != op.ID) {
			err = fmt.Errorf("claimed %+v", got)
		}
		return err
	}, map[string]func() error{
		"DueEvents": func() error {
			due, err := b.DueEvents(time.Time{}, e.clock.Now(), 10)
			if err == nil && len(due) != 1 {
				err = fmt.Errorf("due %+v", due)
			}
			return err
		},
	})
}

func testReplayOnceDurable(t *testing.T, e *env, b store.Backend, h SyncHold) {
	key, fp := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	c := must(b.ClaimKey(key, fp, time.Minute))(t)
	whileHeld(t, h, func() error {
		return b.CompleteKey(key, c.Token, store.Response{Status: 200, Body: []byte("done")}, e.clock.Now().Add(time.Hour))
	}, map[string]func() error{
		"LookupKey": func() error {
			rec, err := b.LookupKey(key)
			if err == nil && (rec == nil || rec.State != store.Completed) {
				err = fmt.Errorf("record %+v", rec)
			}
			return err
		},
	})
}

package badger

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/mulligan-gw/mulligan/store"
)

func TestStatusChangeAndItsEventAreOneWrite(t *testing.T) {
	st := openTemp(t, true)
	st.SetAnnouncer(func(op *store.Operation, result *store.Response) *store.Event {
		if !op.Status.Final() {
			return nil
		}
		return &store.Event{ID: "evt_" + op.ID, Type: "operation." + string(op.Status), OperationID: op.ID, Version: op.Version,
			Endpoint: "e", URL: "https://x.example.com/", OccurredAt: time.Now()}
	})
	for _, id := range []string{"op_1", "op_2"} {
		if _, err := st.AcceptOperation(newOp(id), &store.Request{}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Transition(id, store.Change{To: store.StatusRunning}); err != nil {
			t.Fatal(err)
		}
	}
	if due, _ := st.DueEvents(time.Time{}, time.Now(), 10); len(due) != 0 {
		t.Fatalf("running announced %d events", len(due))
	}
	st.Transition("op_1", store.Change{To: store.StatusSucceeded, Result: &store.Response{Status: 200}})
	st.Transition("op_2", store.Change{To: store.StatusFailed, Error: &store.OperationError{Code: "X"}})
	due, err := st.DueEvents(time.Time{}, time.Now(), 10)
	if err != nil || len(due) != 2 || due[0].Endpoint != "e" {
		t.Fatalf("due: %+v %v", due, err)
	}
	if ev, err := st.GetEvent(due[0].ID); err != nil || ev.Version != 3 || ev.State != store.EventPending {
		t.Fatalf("event: %+v %v", ev, err)
	}
	if later, _ := st.DueEvents(time.Now().Add(time.Hour), time.Now().Add(2*time.Hour), 10); len(later) != 0 {
		t.Fatal("a scan from after the events found them")
	}
	st.MarkDelivered("evt_op_1", store.Attempt{Attempts: 1, Status: 200, At: time.Now()})
	st.DeadLetter("evt_op_2", "refused", store.Attempt{Attempts: 1, Status: 400, At: time.Now()})
	if due, _ := st.DueEvents(time.Time{}, time.Now(), 10); len(due) != 0 {
		t.Fatalf("%d still due", len(due))
	}
	pending, dead, _ := st.CountEvents()
	if dead != 1 || pending != 0 {
		t.Fatalf("pending %d dead %d", pending, dead)
	}
	st.Redeliver("evt_op_2", time.Now())
	st.Reschedule("evt_op_2", time.Now().Add(time.Hour), store.Attempt{})
	if next, _ := st.NextDue(time.Time{}); next.Before(time.Now().Add(59 * time.Minute)) {
		t.Fatalf("next due %v", next)
	}
	if n, err := st.RescheduleEndpoint("e", time.Now()); err != nil || n != 1 {
		t.Fatalf("reschedule: %d %v", n, err)
	}
	if due, _ := st.DueEvents(time.Time{}, time.Now(), 10); len(due) != 1 {
		t.Fatal("the rescheduled event is not due")
	}
}

// putTestEvents stores n pending events of endpoint "e", due now.
func putTestEvents(t *testing.T, st *Store, n int) []string {
	t.Helper()
	ids := make([]string, n)
	// A thousand a transaction: a transaction must fit in 15 % of a memtable (Badger's bound).
	for from := 0; from < n; from += 1000 {
		err := st.update(func(txn *badger.Txn) error {
			for i := from; i < min(from+1000, n); i++ {
				ids[i] = fmt.Sprintf("evt_%06d", i)
				ev := &store.Event{ID: ids[i], Endpoint: "e", URL: "https://x.example.com/", OccurredAt: time.Now(), State: store.EventPending, NextAttempt: time.Now()}
				if err := st.sh.putEvent(txn, ev, nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func wantCounts(t *testing.T, st *Store, pending, dead int) {
	t.Helper()
	p, d, err := st.CountEvents()
	if err != nil || p != pending || d != dead {
		t.Fatalf("CountEvents = %d pending, %d dead (%v); want %d, %d", p, d, err, pending, dead)
	}
}

func TestOutboxCountsFollowEveryChangeAndSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(Options{Dir: dir, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	ids := putTestEvents(t, st, 10)
	wantCounts(t, st, 10, 0)
	now := time.Now()
	st.MarkDelivered(ids[0], store.Attempt{Attempts: 1, Status: 200, At: now})
	st.MarkDelivered(ids[0], store.Attempt{Attempts: 2, Status: 200, At: now}) // stale: already delivered
	for _, id := range ids[1:4] {
		st.DeadLetter(id, "refused", store.Attempt{Attempts: 1, Status: 400, At: now})
	}
	st.DeadLetter(ids[1], "again", store.Attempt{At: now}) // stale: already dead
	st.Reschedule(ids[4], now.Add(time.Hour), store.Attempt{Attempts: 1, Status: 503, At: now})
	wantCounts(t, st, 6, 3)
	if _, err := st.Redeliver(ids[1], now); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, st, 7, 2)

	// A transaction that fails after changing an event leaves the counts alone.
	failed := errors.New("rolled back")
	err = st.update(func(txn *badger.Txn) error {
		ev, _ := getEvent(txn, ids[5])
		prev := *ev
		ev.State = store.EventDead
		if err := st.sh.putEvent(txn, ev, &prev); err != nil {
			return err
		}
		return failed
	})
	if err == nil || !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("update = %v, want the transaction's error", err)
	}
	wantCounts(t, st, 7, 2)

	st.Close()
	st, err = Open(Options{Dir: dir, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	wantCounts(t, st, 7, 2)
}

// TestCountingEventsReadsNoEvent removes the dead-letter index behind the store's back: a count
// that walked the index (as every /metrics scrape once did) would see none.
func TestCountingEventsReadsNoEvent(t *testing.T) {
	st := openTemp(t, false)
	ids := putTestEvents(t, st, 5000)
	for _, id := range ids {
		if err := st.DeadLetter(id, "refused", store.Attempt{At: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	err := st.sh.db.DropPrefix([]byte(prefixDead))
	if err != nil {
		t.Fatal(err)
	}
	wantCounts(t, st, 0, 5000)
}

func TestRedeliveredEventGetsAFreshMaxAge(t *testing.T) {
	st := openTemp(t, false)
	id := putTestEvents(t, st, 1)[0]
	occurred, _ := st.GetEvent(id)
	st.DeadLetter(id, "undelivered past max_age", store.Attempt{Attempts: 7, At: time.Now()})
	redeliveredAt := occurred.OccurredAt.Add(96 * time.Hour)
	ev, err := st.Redeliver(id, redeliveredAt)
	if err != nil {
		t.Fatal(err)
	}
	if ev.State != store.EventPending || ev.Attempts != 0 || !ev.NextAttempt.Equal(redeliveredAt) || !ev.AgeStart().Equal(redeliveredAt) || !ev.DeadAt.IsZero() {
		t.Fatalf("redelivered: %+v (age from %v)", ev, ev.AgeStart())
	}
	if !ev.OccurredAt.Equal(occurred.OccurredAt) {
		t.Fatalf("occurred_at moved from %v to %v", occurred.OccurredAt, ev.OccurredAt)
	}
}

func TestDeadLettersExpireAfterTheirRetention(t *testing.T) {
	st := openTemp(t, false)
	ids := putTestEvents(t, st, 3)
	t0 := time.Now()
	st.DeadLetter(ids[0], "refused", store.Attempt{At: t0})
	st.DeadLetter(ids[1], "refused", store.Attempt{At: t0.Add(time.Hour)})
	wantCounts(t, st, 1, 2)

	n, err := st.ExpireDeadLetters(t0.Add(time.Minute))
	if err != nil || n != 1 {
		t.Fatalf("ExpireDeadLetters = %d, %v; want 1", n, err)
	}
	if _, err := st.GetEvent(ids[0]); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the expired dead letter is still there: %v", err)
	}
	if left, _ := st.DeadLetters("", 10); len(left) != 1 || left[0].ID != ids[1] {
		t.Fatalf("dead letters left: %+v", left)
	}
	wantCounts(t, st, 1, 1)
}

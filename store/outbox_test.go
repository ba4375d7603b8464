package store

import (
	"testing"
	"time"
)

func TestStatusChangeAndItsEventAreOneWrite(t *testing.T) {
	st := openTemp(t, true)
	st.SetAnnouncer(func(op *Operation, result *Response) *Event {
		if !op.Status.Final() {
			return nil
		}
		return &Event{ID: "evt_" + op.ID, Type: "operation." + string(op.Status), OperationID: op.ID, Version: op.Version,
			Endpoint: "e", URL: "https://x.example.com/", OccurredAt: time.Now()}
	})
	for _, id := range []string{"op_1", "op_2"} {
		if _, err := st.AcceptOperation(newOp(id), &Request{}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Transition(id, Change{To: StatusRunning}); err != nil {
			t.Fatal(err)
		}
	}
	if due, _ := st.DueEvents(time.Time{}, time.Now(), 10); len(due) != 0 {
		t.Fatalf("running announced %d events", len(due))
	}
	st.Transition("op_1", Change{To: StatusSucceeded, Result: &Response{Status: 200}})
	st.Transition("op_2", Change{To: StatusFailed, Error: &OperationError{Code: "X"}})
	due, err := st.DueEvents(time.Time{}, time.Now(), 10)
	if err != nil || len(due) != 2 || due[0].Endpoint != "e" {
		t.Fatalf("due: %+v %v", due, err)
	}
	if ev, err := st.GetEvent(due[0].ID); err != nil || ev.Version != 3 || ev.State != EventPending {
		t.Fatalf("event: %+v %v", ev, err)
	}
	if later, _ := st.DueEvents(time.Now().Add(time.Hour), time.Now().Add(2*time.Hour), 10); len(later) != 0 {
		t.Fatal("a scan from after the events found them")
	}
	st.UpdateEvent("evt_op_1", func(e *Event) { e.State = EventDelivered })
	st.UpdateEvent("evt_op_2", func(e *Event) { e.State = EventDead })
	if due, _ := st.DueEvents(time.Time{}, time.Now(), 10); len(due) != 0 {
		t.Fatalf("%d still due", len(due))
	}
	pending, dead, _ := st.CountEvents()
	if dead != 1 || pending != 0 {
		t.Fatalf("pending %d dead %d", pending, dead)
	}
	st.UpdateEvent("evt_op_2", func(e *Event) { e.State, e.NextAttempt = EventPending, time.Now().Add(time.Hour) })
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

package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

var outboxTests = []test{
	{"StatusChangeAndItsEventAreOneWrite", testStatusChangeAndEvent},
	{"AcceptOfARunningCallIsAnnouncedInTheSameWrite", testAcceptAnnounces},
	{"ClaimEventIsExclusiveAcrossWorkers", testClaimEventIsExclusive},
	{"ClaimRacingADeliveryGetsNothing", testClaimRacingDelivery},
	{"DeliveredEventIsNeverSentAgain", testDeliveredIsFinal},
	{"RescheduledEventIsDueAtItsNextAttempt", testReschedule},
	{"DeadLetterRedeliversWithAFreshMaxAge", testDeadLetterAndRedeliver},
	{"EndpointStateAndRescheduleEndpoint", testEndpoints},
}

// announcer announces final statuses to endpoint "e", on the test's clock.
func (e *env) announcer() store.Announcer {
	return func(op *store.Operation, result *store.Response) *store.Event {
		if !op.Status.Final() {
			return nil
		}
		payload, _ := json.Marshal(map[string]any{"id": op.ID, "status": op.Status})
		return &store.Event{ID: "evt_" + op.ID, Type: "operation." + string(op.Status), OperationID: op.ID, Version: op.Version,
			Endpoint: "e", URL: "https://receiver.example.com/hook", OccurredAt: e.clock.Now(), Operation: payload}
	}
}

// event makes operation i final, which writes its event; it returns the event's id.
func (e *env) event(t *testing.T, b store.Backend, i int) string {
	t.Helper()
	e.accept(t, b, "s", i, 1)
	must(b.Transition(opID(i), store.Change{To: store.StatusCanceled}))(t)
	return "evt_" + opID(i)
}

func testStatusChangeAndEvent(t *testing.T, e *env) {
	b := e.open()
	b.SetAnnouncer(e.announcer())
	e.accept(t, b, "s", 0, 2)
	must(b.ClaimNext("w1", time.Minute))(t)
	if due := must(b.DueEvents(time.Time{}, e.clock.Now(), 10))(t); len(due) != 0 {
		t.Fatalf("a non-final status was announced: %+v", due)
	}
	must(b.Transition(opID(0), store.Change{To: store.StatusSucceeded, Result: &store.Response{Status: 200}}))(t)
	must(b.Transition(opID(1), store.Change{To: store.StatusCanceled}))(t)
	due := must(b.DueEvents(time.Time{}, e.clock.Now(), 10))(t)
	if len(due) != 2 || due[0].Endpoint != "e" {
		t.Fatalf("due: %+v", due)
	}
	ev := must(b.GetEvent("evt_" + opID(0)))(t)
	if ev.State != store.EventPending || ev.Version != 3 || ev.Type != "operation.succeeded" || !ev.NextAttempt.Equal(ev.OccurredAt) ||
		string(ev.Operation) != `{"id":"op_000000","status":"succeeded"}` {
		t.Fatalf("event: %+v", ev)
	}
	if later := must(b.DueEvents(e.clock.Now().Add(time.Second), e.clock.Now().Add(time.Hour), 10))(t); len(later) != 0 {
		t.Fatalf("a scan from after the events found %+v", later)
	}
	if pending, dead := pair(b.CountEvents())(t); pending != 2 || dead != 0 {
		t.Fatalf("pending %d dead %d", pending, dead)
	}
	// A refused change writes no event.
	if _, err := b.Transition(opID(1), store.Change{To: store.StatusFailed}); !errors.Is(err, store.ErrIllegalTransition) {
		t.Fatal(err)
	}
	if pending, _ := pair(b.CountEvents())(t); pending != 2 {
		t.Fatalf("pending %d after a refused change", pending)
	}
}

// A call converted to an operation while it runs is announced (operation.running) with its
// accept; a queued one is not, by this announcer.
func testAcceptAnnounces(t *testing.T, e *env) {
	b := e.open()
	b.SetAnnouncer(func(op *store.Operation, _ *store.Response) *store.Event {
		if op.Status != store.StatusRunning {
			return nil
		}
		return &store.Event{ID: "evt_" + op.ID, Type: "operation.running", OperationID: op.ID, Version: op.Version,
			Endpoint: "e", OccurredAt: e.clock.Now()}
	})
	e.accept(t, b, "s", 0, 1)
	op := e.newOp(1, "s")
	op.Status, op.Holder, op.LeaseUntil = store.StatusRunning, "w1", e.clock.Now().Add(time.Minute)
	must(b.AcceptOperation(op, &store.Request{}, nil))(t)
	due := must(b.DueEvents(time.Time{}, e.clock.Now(), 10))(t)
	if len(due) != 1 || due[0].ID != "evt_"+opID(1) {
		t.Fatalf("due: %+v, want the running call's event only", due)
	}
}

func testClaimEventIsExclusive(t *testing.T, e *env) {
	handles := []store.Backend{e.open(), e.open()}
	handles[0].SetAnnouncer(e.announcer())
	id := e.event(t, handles[0], 0)
	var wg sync.WaitGroup
	won := make(chan string, 10)
	for w := range 10 {
		wg.Go(func() {
			ev, err := handles[w%2].ClaimEvent(id, fmt.Sprintf("w%d", w), time.Minute)
			if err != nil {
				t.Error(err)
			}
			if ev != nil {
				won <- fmt.Sprintf("w%d", w)
			}
		})
	}
	wg.Wait()
	close(won)
	var winners []string
	for w := range won {
		winners = append(winners, w)
	}
	if len(winners) != 1 {
		t.Fatalf("claimed by %v, want exactly one worker", winners)
	}
	e.clock.Advance(61 * time.Second) // the winner fell silent: its claim runs out
	if ev := must(handles[1].ClaimEvent(id, "late", time.Minute))(t); ev == nil || ev.ID != id {
		t.Fatalf("after the claim's lease: %+v", ev)
	}
}

// A claim by one worker that is under way while another worker records the event's delivery
// never hands the acknowledged event out again.
func testClaimRacingDelivery(t *testing.T, e *env) {
	a := e.open()
	a.SetAnnouncer(e.announcer())
	id := e.event(t, a, 0)
	if ev := must(a.ClaimEvent(id, "w1", time.Minute))(t); ev == nil {
		t.Fatal("not claimed")
	}
	// The other worker's handle stops inside its claim, at its first look at the clock.
	paused, resume := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	b := e.storage(func() time.Time {
		if armed.CompareAndSwap(true, false) {
			close(paused)
			<-resume
		}
		return e.clock.Now()
	})
	armed.Store(true)
	got := make(chan *store.Event, 1)
	go func() {
		ev, err := b.ClaimEvent(id, "w2", time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- ev
	}()
	select {
	case <-paused:
	case <-time.After(30 * time.Second):
		t.Fatal("the claim never looked at the clock")
	}
	ok(t, a.MarkDelivered(id, store.Attempt{Attempts: 1, At: e.clock.Now(), Status: 200}))
	close(resume)
	if ev := <-got; ev != nil {
		t.Fatalf("a claim racing the delivery got the delivered event: %+v", ev)
	}
	if ev := must(b.GetEvent(id))(t); ev.State != store.EventDelivered {
		t.Fatalf("state %s, want delivered", ev.State)
	}
}

func testDeliveredIsFinal(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	a.SetAnnouncer(e.announcer())
	id := e.event(t, a, 0)
	if ev := must(a.ClaimEvent(id, "w1", time.Minute))(t); ev == nil {
		t.Fatal("not claimed")
	}
	at := e.clock.Now()
	ok(t, a.MarkDelivered(id, store.Attempt{Attempts: 1, At: at, Status: 204}))
	ev := must(b.GetEvent(id))(t)
	if ev.State != store.EventDelivered || ev.Attempts != 1 || ev.LastStatus != 204 || !ev.DeliveredAt.Equal(at) {
		t.Fatalf("delivered: %+v", ev)
	}
	e.clock.Advance(2 * time.Minute)
	if got := must(b.ClaimEvent(id, "w2", time.Minute))(t); got != nil {
		t.Fatalf("a delivered event was claimed again: %+v", got)
	}
	if due := must(b.DueEvents(time.Time{}, e.clock.Now(), 10))(t); len(due) != 0 {
		t.Fatalf("a delivered event is due: %+v", due)
	}
	ok(t, b.Reschedule(id, e.clock.Now(), store.Attempt{Attempts: 2, At: e.clock.Now(), Status: 500}))
	ok(t, b.DeadLetter(id, "late", store.Attempt{Attempts: 2, At: e.clock.Now()}))
	if got := must(b.Redeliver(id, e.clock.Now()))(t); got.State != store.EventDelivered {
		t.Fatalf("redeliver of a delivered event: %+v", got)
	}
	if got := must(b.GetEvent(id))(t); got.State != store.EventDelivered || got.Attempts != 1 || got.LastStatus != 204 {
		t.Fatalf("a delivered event changed: %+v", got)
	}
	if pending, dead := pair(b.CountEvents())(t); pending != 0 || dead != 0 {
		t.Fatalf("pending %d dead %d", pending, dead)
	}
}

func testReschedule(t *testing.T, e *env) {
	b := e.open()
	b.SetAnnouncer(e.announcer())
	id := e.event(t, b, 0)
	must(b.ClaimEvent(id, "w1", time.Minute))(t)
	next := e.clock.Now().Add(5 * time.Minute)
	ok(t, b.Reschedule(id, next, store.Attempt{Attempts: 1, At: e.clock.Now(), Status: 503, Error: "busy"}))
	if due := must(b.DueEvents(time.Time{}, e.clock.Now(), 10))(t); len(due) != 0 {
		t.Fatalf("due before its next attempt: %+v", due)
	}
	if ev := must(b.ClaimEvent(id, "w2", time.Minute))(t); ev != nil {
		t.Fatal("claimed before its next attempt")
	}
	if at := must(b.NextDue(time.Time{}))(t); !at.Equal(next) {
		t.Fatalf("next due %v, want %v", at, next)
	}
	ev := must(b.GetEvent(id))(t)
	if ev.Attempts != 1 || ev.LastStatus != 503 || ev.LastError != "busy" || !ev.NextAttempt.Equal(next) {
		t.Fatalf("rescheduled: %+v", ev)
	}
	// An uncharged wait (a breaker open) keeps the count.
	ok(t, b.Reschedule(id, next, store.Attempt{At: e.clock.Now()}))
	if ev := must(b.GetEvent(id))(t); ev.Attempts != 1 || ev.LastStatus != 503 {
		t.Fatalf("an uncharged wait changed the attempt: %+v", ev)
	}
	e.clock.Advance(5 * time.Minute)
	due := must(b.DueEvents(time.Time{}, e.clock.Now(), 10))(t)
	if len(due) != 1 || due[0].ID != id || !due[0].At.Equal(next) {
		t.Fatalf("due: %+v", due)
	}
	if ev := must(b.ClaimEvent(id, "w2", time.Minute))(t); ev == nil {
		t.Fatal("not claimable when due")
	}
}

func testDeadLetterAndRedeliver(t *testing.T, e *env) {
	b := e.open()
	b.SetAnnouncer(e.announcer())
	var evts []string
	for i := range 3 {
		evts = append(evts, e.event(t, b, i))
	}
	for _, id := range evts[:2] {
		ok(t, b.DeadLetter(id, "max_attempts", store.Attempt{Attempts: 7, At: e.clock.Now(), Status: 500}))
	}
	if pending, dead := pair(b.CountEvents())(t); pending != 1 || dead != 2 {
		t.Fatalf("pending %d dead %d", pending, dead)
	}
	first := must(b.DeadLetters("", 1))(t)
	if len(first) != 1 || first[0].ID != evts[0] || first[0].DeadReason != "max_attempts" || first[0].State != store.EventDead {
		t.Fatalf("first dead letter: %+v", first)
	}
	if rest := must(b.DeadLetters(evts[0], 10))(t); len(rest) != 1 || rest[0].ID != evts[1] {
		t.Fatalf("after %s: %+v", evts[0], rest)
	}
	if due := must(b.DueEvents(time.Time{}, e.clock.Now(), 10))(t); len(due) != 1 || due[0].ID != evts[2] {
		t.Fatalf("due: %+v", due)
	}
	e.clock.Advance(48 * time.Hour)
	at := e.clock.Now()
	ev := must(b.Redeliver(evts[0], at))(t)
	if ev.State != store.EventPending || ev.Attempts != 0 || ev.DeadReason != "" || !ev.NextAttempt.Equal(at) || !ev.AgeStart().Equal(at) {
		t.Fatalf("redelivered: %+v", ev)
	}
	if got := must(b.GetEvent(evts[0]))(t); got.State != store.EventPending || !got.AgeFrom.Equal(at) {
		t.Fatalf("read back: %+v", got)
	}
	if pending, dead := pair(b.CountEvents())(t); pending != 2 || dead != 1 {
		t.Fatalf("pending %d dead %d after redelivery", pending, dead)
	}
	if got := must(b.Redeliver(evts[2], at))(t); got.State != store.EventPending || !got.AgeFrom.IsZero() {
		t.Fatalf("redeliver of a pending event changed it: %+v", got)
	}
	if _, err := b.GetEvent("evt_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown event: %v", err)
	}
}

func testEndpoints(t *testing.T, e *env) {
	b := e.open()
	b.SetAnnouncer(e.announcer())
	if st := must(b.GetEndpointState("e"))(t); st.Disabled {
		t.Fatalf("unknown endpoint: %+v", st)
	}
	want := store.EndpointState{Disabled: true, DisabledAt: e.clock.Now(), Reason: "410 Gone"}
	ok(t, b.SetEndpointState("e", want))
	if st := must(b.GetEndpointState("e"))(t); st.Disabled != true || !st.DisabledAt.Equal(want.DisabledAt) || st.Reason != want.Reason {
		t.Fatalf("state: %+v", st)
	}
	id := e.event(t, b, 0)
	ok(t, b.Reschedule(id, e.clock.Now().Add(time.Hour), store.Attempt{}))
	if n := must(b.RescheduleEndpoint("e", e.clock.Now()))(t); n != 1 {
		t.Fatalf("rescheduled %d, want 1", n)
	}
	if n := must(b.RescheduleEndpoint("other", e.clock.Now()))(t); n != 0 {
		t.Fatalf("rescheduled %d of another endpoint", n)
	}
	if due := must(b.DueEvents(time.Time{}, e.clock.Now(), 10))(t); len(due) != 1 {
		t.Fatalf("due after reschedule: %+v", due)
	}
}

package courier

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
	"github.com/mulligan-gw/mulligan/webhook"
)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// outbox is real Badger on a temp directory reading clock, whose announcer writes one event
// for endpoint "hooks" at url when an operation becomes final.
func outbox(t *testing.T, clock clockwork.Clock, url string) *badger.Store {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	st.SetAnnouncer(func(op *store.Operation, _ *store.Response) *store.Event {
		if !op.Status.Final() {
			return nil
		}
		return &store.Event{ID: "evt_" + op.ID, Type: "operation.succeeded", OperationID: op.ID, Version: op.Version,
			Endpoint: "hooks", URL: url, OccurredAt: clock.Now(), Operation: json.RawMessage(`{}`)}
	})
	return st
}

// finish writes operation id through to succeeded, which announces its event.
func finish(t *testing.T, st *badger.Store, clock clockwork.Clock, id string) {
	t.Helper()
	op := &store.Operation{ID: id, Scope: "s", Status: store.StatusQueued, Version: 1, Method: "POST", Path: "/v1/x",
		SubmittedAt: clock.Now(), Retention: time.Hour}
	if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Transition(id, store.Change{To: store.StatusRunning}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Transition(id, store.Change{To: store.StatusSucceeded, Result: &store.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
}

// hooks is endpoint "hooks" signed with testSecret, every retry due after wait.
func hooks(t *testing.T, wait time.Duration) map[string]Endpoint {
	t.Helper()
	secret, err := webhook.ParseSecret(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]Endpoint{"hooks": {Secrets: []webhook.Secret{secret}, Timeout: 5 * time.Second, AllowPrivate: true,
		MaxAge: 72 * time.Hour, MaxAttempts: 3, Breaker: Breaker{Failures: 100, Cooldown: time.Minute},
		RetryWait: func(int, time.Duration) time.Duration { return wait }}}
}

func render(ev *store.Event, attempt int) ([]byte, error) {
	return json.Marshal(map[string]any{"event_id": ev.ID, "delivery_attempt": attempt})
}

// TestDeliveryUnderWayWhenAReloadDropsTheWebhooksWaits: the courier picked an event, then a
// reload to a config without webhooks cleared its endpoints before the delivery read them. The
// delivery must leave the event pending, uncharged (it dereferenced nil hooks before).
func TestDeliveryUnderWayWhenAReloadDropsTheWebhooksWaits(t *testing.T) {
	clock := clockwork.NewRealClock()
	st := outbox(t, clock, "http://127.0.0.1:9/hook")
	finish(t, st, clock, "op_1")

	c := New(Options{Store: st, Worker: "worker-1", Render: render})
	defer c.Stop()
	c.Configure(nil) // the reload's config has no webhooks
	c.sends.Add(1)
	c.deliver(store.Due{ID: "evt_op_1", Endpoint: "hooks"})

	ev, err := st.GetEvent("evt_op_1")
	if err != nil || ev.State != store.EventPending || ev.Attempts != 0 {
		t.Fatalf("event after the delivery: %+v, %v; want pending with no attempt", ev, err)
	}
}

// TestRetryIsSentWhenDueOnTheCouriersClock: a 503 reschedules the event its endpoint's retry
// wait later on the courier's clock; nothing is sent before the clock reaches it, and the
// retry that is then sent is recorded delivered, with both attempts in the recent attempts.
func TestRetryIsSentWhenDueOnTheCouriersClock(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now().UTC().Truncate(time.Millisecond))
	secret, _ := webhook.ParseSecret(testSecret)
	calls := make(chan int, 4)
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify([]webhook.Secret{secret}, r.Header, body, time.Now()); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		n++
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		calls <- n
	}))
	defer srv.Close()
	st := outbox(t, clock, srv.URL+"/hook")
	c := New(Options{Store: st, Worker: "worker-1", Clock: clock, Render: render})
	c.Configure(hooks(t, 30*time.Second))
	c.Start()
	defer c.Stop()
	finish(t, st, clock, "op_1")
	c.Kick()

	<-calls
	ev := testkit.AwaitEvent(t, st, "evt_op_1", "the 503 recorded", func(ev *store.Event) bool { return ev.Attempts == 1 })
	if ev.State != store.EventPending || ev.NextAttempt.Sub(clock.Now()) != 30*time.Second {
		t.Fatalf("after the 503: %s, due in %v; want pending, due in 30s", ev.State, ev.NextAttempt.Sub(clock.Now()))
	}
	clock.Advance(29 * time.Second)
	c.Kick()
	select {
	case <-calls:
		t.Fatal("the retry was sent before it was due on the courier's clock")
	case <-time.After(100 * time.Millisecond):
	}
	clock.Advance(time.Second)
	c.Kick()
	<-calls
	testkit.AwaitEvent(t, st, "evt_op_1", "delivered", func(ev *store.Event) bool { return ev.State == store.EventDelivered })
	got := c.RecentAttempts()
	if len(got) != 2 || got[0].Status != 503 || got[1].Result != webhook.Delivered.String() {
		t.Fatalf("recent attempts %+v; want the 503, then the delivery", got)
	}
}

// TestStopWaitsForTheDeliveryUnderWay: Stop returns only once the attempt under way has
// ended, and that attempt, abandoned, leaves the event pending and uncharged, for a later run.
func TestStopWaitsForTheDeliveryUnderWay(t *testing.T) {
	clock := clockwork.NewRealClock()
	entered, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	st := outbox(t, clock, srv.URL+"/hook")
	c := New(Options{Store: st, Worker: "worker-1", Clock: clock, Render: render})
	c.Configure(hooks(t, time.Second))
	c.Start()
	finish(t, st, clock, "op_1")
	c.Kick()
	<-entered
	if c.Stats().Delivering != 1 {
		t.Fatalf("stats while the attempt is under way: %+v; want 1 delivering", c.Stats())
	}
	stopped := make(chan struct{})
	go func() { c.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop has not returned in 10s")
	}
	if d := c.Stats().Delivering; d != 0 {
		t.Fatalf("Stop returned with %d deliveries under way", d)
	}
	ev, err := st.GetEvent("evt_op_1")
	if err != nil || ev.State != store.EventPending || ev.Attempts != 0 {
		t.Fatalf("event after Stop: %+v, %v; want pending with no attempt", ev, err)
	}
}

// TestConfigureMakesANewEndpointsEventsDueBeforeItReturns: an event waiting for an endpoint
// that a config now declares is due once Configure returns. Made due later, in the background,
// it could land after the first attempt had recorded its retry wait and cut that wait short.
func TestConfigureMakesANewEndpointsEventsDueBeforeItReturns(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now().UTC().Truncate(time.Millisecond))
	st := outbox(t, clock, "http://127.0.0.1:1/hook")
	finish(t, st, clock, "op_1")
	if err := st.Reschedule("evt_op_1", clock.Now().Add(time.Hour), store.Attempt{}); err != nil {
		t.Fatal(err)
	}
	c := New(Options{Store: st, Worker: "worker-1", Clock: clock, Render: render})
	defer c.Stop()
	c.Configure(hooks(t, 30*time.Second))
	ev, err := st.GetEvent("evt_op_1")
	if err != nil {
		t.Fatal(err)
	}
	if !ev.NextAttempt.Equal(clock.Now()) {
		t.Fatalf("after Configure the event is due in %v; want now", ev.NextAttempt.Sub(clock.Now()))
	}
}

// heldReschedule is an outbox whose RescheduleEndpoint waits for the test's release.
type heldReschedule struct {
	*badger.Store
	entered, release chan struct{}
}

func (h heldReschedule) RescheduleEndpoint(endpoint string, at time.Time) (int, error) {
	h.entered <- struct{}{}
	<-h.release
	return h.Store.RescheduleEndpoint(endpoint, at)
}

// TestAttemptDuringConfigureKeepsItsRetryWait: a config declares an endpoint whose event is
// waiting. Until its events are made due, no attempt may start: an attempt in between would
// record its retry wait, and the making due would then cut that wait short (a failing
// receiver hit again at once). Once Configure has returned, the first attempt's 503 keeps its
// 30 s wait.
func TestAttemptDuringConfigureKeepsItsRetryWait(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now().UTC().Truncate(time.Millisecond))
	calls := make(chan int, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		calls <- http.StatusServiceUnavailable
	}))
	defer srv.Close()
	st := outbox(t, clock, srv.URL+"/hook")
	held := heldReschedule{Store: st, entered: make(chan struct{}), release: make(chan struct{})}
	c := New(Options{Store: held, Worker: "worker-1", Clock: clock, Render: render})
	c.Start()
	defer c.Stop()
	finish(t, st, clock, "op_1") // announced for "hooks", which no config declares yet

	configured := make(chan struct{})
	go func() { c.Configure(hooks(t, 30*time.Second)); close(configured) }()
	<-held.entered
	c.Kick()
	select {
	case <-calls:
		t.Error("an attempt started before the new endpoint's events were made due")
	case <-time.After(200 * time.Millisecond):
	}
	close(held.release)
	<-configured
	c.Kick()
	testkit.Receive(t, calls, "the first attempt")
	ev := testkit.AwaitEvent(t, st, "evt_op_1", "the 503 recorded", func(ev *store.Event) bool { return ev.Attempts >= 1 })
	c.Kick()
	select {
	case <-calls:
		t.Fatal("the retry was sent at once: the 503's wait was cut short")
	case <-time.After(200 * time.Millisecond):
	}
	if ev, _ = st.GetEvent("evt_op_1"); ev.Attempts != 1 || ev.NextAttempt.Sub(clock.Now()) != 30*time.Second {
		t.Fatalf("after the 503: %d attempts, due in %v; want 1, due in 30s", ev.Attempts, ev.NextAttempt.Sub(clock.Now()))
	}
}

package module

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
)

// deadLetterIDs lists the event ids in the dead-letter list.
func (g *gateway) deadLetterIDs(t *testing.T) []string {
	t.Helper()
	var page struct {
		DeadLetters []struct {
			ID string `json:"id"`
		} `json:"dead_letters"`
	}
	if err := json.Unmarshal([]byte(g.adminCall("GET", "/mulligan/dead-letters?limit=1000")), &page); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(page.DeadLetters))
	for i, d := range page.DeadLetters {
		ids[i] = d.ID
	}
	return ids
}

// TestRedeliveredDeadLetterPastMaxAgeIsDelivered: an event dead-lettered and redelivered after
// its max_age gets a fresh max_age from the redelivery, and reaches the receiver (before, the
// courier dead-lettered it again at once, unsent). The clock moves it past max_age.
func TestRedeliveredDeadLetterPastMaxAgeIsDelivered(t *testing.T) {
	clock := newFakeClock()
	rc, deliveries, refuse := failingReceiver(t, clock, http.StatusBadRequest)
	url := rc.srv.URL + "/hook"
	hooks := testEndpoint(t, "hooks", url)
	hooks["hooks"].Target("hooks").MaxAge = time.Hour
	lr := newLoopRunner(t, clock, answerOK, 0, hooks)
	lr.Accept(t, "op_1", testExecution(time.Minute, 3), &store.Callback{Endpoint: "hooks", URL: url}, chat("refused"))
	lr.ClaimNext()
	d := awaitDelivery(t, clock, deliveries, "the refused attempt")
	testkit.AwaitEvent(t, lr.st, d.eventID, "dead-lettered", func(ev *store.Event) bool { return ev.State == store.EventDead })
	clock.Advance(2 * time.Hour) // the event is now older than max_age
	refuse.Store(false)
	if err := (&AdminAPI{}).redeliver(httptest.NewRecorder(), lr.Runner, d.eventID); err != nil {
		t.Fatal(err)
	}
	awaitDelivery(t, clock, deliveries, "the redelivery")
	ev := testkit.AwaitEvent(t, lr.st, d.eventID, "delivered or dead again", func(ev *store.Event) bool { return ev.State != store.EventPending })
	if ev.State != store.EventDelivered || rc.delivered() != 1 {
		t.Fatalf("the redelivered event is %s (%s), receiver accepted %d", ev.State, ev.DeadReason, rc.delivered())
	}
	if got := rc.attempts.Load(); got != 2 {
		t.Fatalf("the receiver saw %d attempts, want 2 (the refused one and the redelivery)", got)
	}
}

// TestRedeliverAllEndsWhileEventsDieAgain: the receiver refuses everything, so each redelivered
// event is dead-lettered again moments later. "Redeliver all" must page once through the 30
// that were dead when it was called and answer (before, it looped forever).
func TestRedeliverAllEndsWhileEventsDieAgain(t *testing.T) {
	const n = 30
	rc := newReceiver(t, secretA, func(*http.Request) int { return http.StatusBadRequest })
	g := startGateway(t, modelserver.Config{}, webhooksBlock(rc.srv.URL+"/hook", "", secretA))
	for i := range n {
		_, op := g.submit(t, fmt.Sprintf("dies-%d", i))
		g.await(t, op.OperationID)
	}
	testkit.WaitFor(t, 5*time.Second, "len(g.deadLetterIDs(t)) == n", func() bool { return len(g.deadLetterIDs(t)) == n })

	for round := 1; round <= 2; round++ {
		done := make(chan string, 1)
		go func() { done <- g.adminCall("POST", "/mulligan/dead-letters/redeliver") }()
		select {
		case body := <-done:
			if !strings.Contains(body, fmt.Sprintf(`"redelivering":%d`, n)) {
				t.Fatalf("round %d: redeliver all answered %s, want %d redelivered", round, body, n)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: redeliver all has not answered in 20s", round)
		}
		testkit.WaitFor(t, 5*time.Second, "len(g.deadLetterIDs(t)) == n && rc.attempts.Load() == int64(n*(round+1))", func() bool { return len(g.deadLetterIDs(t)) == n && rc.attempts.Load() == int64(n*(round+1)) })
	}
}

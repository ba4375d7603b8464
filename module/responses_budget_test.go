package module

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/responses"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// countedResultLoads is the real store, counting its loads of results.
type countedResultLoads struct {
	*badger.Store
	loads atomic.Int64
}

func (c *countedResultLoads) LoadResult(id string) (*store.Response, error) {
	c.loads.Add(1)
	return c.Store.LoadResult(id)
}

// Reading a finished response's recorded answer (a poll, a replay) reserves its bytes from the
// block's max_buffered: while other answers or bodies hold the budget it is 503 GATEWAY_BUSY,
// not one more copy in memory; an answer larger than the whole budget is still read alone. A
// poll reads the answer once: later ones answer the final object kept.
func TestResponsesReadingAFinishedAnswerIsBoundedByMaxBuffered(t *testing.T) {
	st := &countedResultLoads{Store: openBadger(t)}
	now := time.Now()
	op := &store.Operation{ID: newID("resp_", now), Scope: "s", Status: store.StatusQueued, Version: 1, Method: "POST", Path: "/v1/responses",
		SubmittedAt: now, Retention: time.Hour, Kind: responses.Kind, Urgency: store.DefaultUrgency}
	if _, err := st.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/responses", Header: http.Header{}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimNext("w", time.Minute); err != nil {
		t.Fatal(err)
	}
	answer := "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"object\":\"response\",\"status\":\"completed\",\"output\":[]}}\n\n"
	if _, err := st.Transition(op.ID, store.Change{To: store.StatusSucceeded, Holder: "w",
		Result: &store.Response{Status: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: []byte(answer)}}); err != nil {
		t.Fatal(err)
	}
	h := &Handler{bodies: &byteBudget{limit: 4 << 10}, clock: realClock}
	get := func(query string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		a := &respCall{h: h, w: w, r: httptest.NewRequest("GET", "/v1/responses/"+op.ID+query, nil), st: st, caller: caller{scope: "s"},
			now: time.Now(), log: newReqLog(zap.NewNop())}
		a.route().Serve(op.ID)
		return w
	}
	hold := func() {
		if !h.bodies.take(h.bodies.limit - 100) { // other bodies and answers hold most of it
			t.Fatal("the budget was not given back")
		}
	}
	hold()
	for _, q := range []string{"", "?stream=true"} {
		if w := get(q); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), string(apierr.CodeBusy)) {
			t.Fatalf("%q with the budget held: %d %s, want 503 %s", q, w.Code, w.Body, apierr.CodeBusy)
		}
	}
	h.bodies.give(h.bodies.limit - 100)
	if w := get(""); w.Code != 200 || !strings.Contains(w.Body.String(), `"completed"`) {
		t.Fatalf("alone: %d %s", w.Code, w.Body)
	}
	finalObjects.Wait()
	loads := st.loads.Load()
	hold()
	if w := get(""); w.Code != 200 || !strings.Contains(w.Body.String(), `"completed"`) || st.loads.Load() != loads {
		t.Fatalf("polled again: %d %s after %d loads, want the object kept and no load", w.Code, w.Body, st.loads.Load()-loads)
	}
	if w := get("?stream=true"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("a replay with the budget held: %d %s", w.Code, w.Body)
	}
	h.bodies.give(h.bodies.limit - 100)
	h.bodies.limit = 100 // smaller than the answer: read alone
	if w := get("?stream=true"); w.Code != 200 || !strings.Contains(w.Body.String(), "response.completed") {
		t.Fatalf("an answer over the whole budget, alone: %d %s", w.Code, w.Body)
	}
	if used := h.bodies.used.Load(); used != 0 {
		t.Fatalf("%d bytes still reserved", used)
	}
}

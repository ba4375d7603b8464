package module

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/responses"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// Reading a finished response's recorded answer (a poll, a replay) reserves its bytes from the
// block's max_buffered: while other answers or bodies hold the budget it is 503 GATEWAY_BUSY,
// not one more copy in memory; an answer larger than the whole budget is still read alone.
func TestResponsesReadingAFinishedAnswerIsBoundedByMaxBuffered(t *testing.T) {
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	op := &store.Operation{ID: "resp_budget", Scope: "s", Status: store.StatusQueued, Version: 1, Method: "POST", Path: "/v1/responses",
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
		a.retrieve(op.ID)
		return w
	}
	if w := get(""); w.Code != 200 || !strings.Contains(w.Body.String(), `"completed"`) {
		t.Fatalf("alone: %d %s", w.Code, w.Body)
	}
	if !h.bodies.take(h.bodies.limit - 100) { // other bodies and answers hold most of it
		t.Fatal("the budget was not given back")
	}
	for _, q := range []string{"", "?stream=true"} {
		if w := get(q); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), string(apierr.CodeBusy)) {
			t.Fatalf("%q with the budget held: %d %s, want 503 %s", q, w.Code, w.Body, apierr.CodeBusy)
		}
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

package responses

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// A response with a callback announces its final status in OpenAI's event types, the one its
// final object has; other moves, and responses without a callback, announce nothing.
func TestAnnounceNamesTheFinalObjectsStatus(t *testing.T) {
	now := time.Unix(1700000000, 0)
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream")
	answer := func(final string) *store.Response {
		return &store.Response{Status: http.StatusOK, Header: h, Body: []byte("event: " + final + "\ndata: {\"type\":\"" + final +
			"\",\"response\":{\"status\":\"" + final[len("response."):] + "\"}}\n\n")}
	}
	cb := &store.Callback{URL: "https://hooks.example/r", Endpoint: "e1"}
	for _, c := range []struct {
		status store.Status
		result *store.Response
		cb     *store.Callback
		want   string
	}{
		{store.StatusSucceeded, answer("response.completed"), cb, "response.completed"},
		{store.StatusSucceeded, answer("response.incomplete"), cb, "response.incomplete"},
		{store.StatusSucceeded, nil, cb, "response.failed"}, // no final event: failed
		{store.StatusFailed, nil, cb, "response.failed"},
		{store.StatusCanceled, nil, cb, "response.cancelled"},
		{store.StatusRunning, nil, cb, ""},
		{store.StatusSucceeded, answer("response.completed"), nil, ""},
	} {
		op := &store.Operation{ID: "resp_1", Kind: Kind, Status: c.status, Callback: c.cb, Version: 3, SubmittedAt: now, Traceparent: "00-tp"}
		ev := Announce(op, c.result, "evt_1", now)
		switch {
		case c.want == "" && ev != nil:
			t.Errorf("%s without callback %v: announced %s", c.status, c.cb == nil, ev.Type)
		case c.want == "":
		case ev == nil || ev.Type != c.want || ev.ID != "evt_1" || ev.OperationID != "resp_1" || ev.Version != 3 ||
			ev.URL != cb.URL || ev.Endpoint != "e1" || !ev.OccurredAt.Equal(now) || ev.Traceparent != "00-tp":
			t.Errorf("%s: %+v, want %s", c.status, ev, c.want)
		}
	}
}

// A response event is delivered in OpenAI's envelope, its data the response's id.
func TestRenderEventIsOpenAIsEnvelope(t *testing.T) {
	op := &store.Operation{ID: "resp_1", Kind: Kind, Status: store.StatusCanceled, Callback: &store.Callback{URL: "https://x"}}
	b, err := RenderEvent(Announce(op, nil, "evt_1", time.Unix(1700000000, 0)))
	var env struct {
		ID, Object, Type string
		CreatedAt        int64 `json:"created_at"`
		Data             map[string]string
	}
	if err != nil || json.Unmarshal(b, &env) != nil || env.ID != "evt_1" || env.Object != "event" || env.Type != "response.cancelled" ||
		env.CreatedAt != 1700000000 || len(env.Data) != 1 || env.Data["id"] != "resp_1" {
		t.Fatalf("%s %v", b, err)
	}
}

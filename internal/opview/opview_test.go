package opview

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestQueuedOperationShowsItsDeadlineAndPollHint(t *testing.T) {
	op := &store.Operation{ID: "op_1", Status: store.StatusQueued, Method: "POST", Path: "/v1/chat",
		SubmittedAt: t0, QueueDeadline: t0.Add(time.Minute), Urgency: 3}
	v := Of("/ops", op, nil, t0)
	if v.Done || v.Type != "/v1/chat" || v.RetryAfter == nil || *v.RetryAfter != 2 {
		t.Fatalf("view = %+v", v)
	}
	if v.QueueDeadline == nil || !v.QueueDeadline.Equal(t0.Add(time.Minute)) {
		t.Fatalf("queue deadline = %v", v.QueueDeadline)
	}
	if v.Links != (Links{Self: "/ops/op_1", Cancel: "/ops/op_1/cancel", Result: "/ops/op_1/result"}) {
		t.Fatalf("links = %+v", v.Links)
	}
	if v.StartedAt != nil || v.Response != nil || v.Error != nil {
		t.Fatalf("a queued operation shows no start, response or error: %+v", v)
	}
}

func TestFinalOperationInlinesItsCompactJSONResult(t *testing.T) {
	op := &store.Operation{ID: "op_2", Status: store.StatusSucceeded, Type: "chat", SubmittedAt: t0,
		StartedAt: t0.Add(time.Second), FinishedAt: t0.Add(2 * time.Second), Retention: time.Hour,
		Result: &store.ResultMeta{Status: 200, ContentType: "application/json"}}
	v := Of("/ops", op, &store.Response{Status: 200, Body: []byte(`{ "a" : 1 }`)}, t0.Add(3*time.Second))
	if !v.Done || v.RetryAfter != nil || v.Type != "chat" || v.Response == nil || string(v.Response.Body) != `{"a":1}` {
		t.Fatalf("view = %+v", v)
	}
	if !v.UpdatedAt.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("updated_at = %v, want the latest timestamp", v.UpdatedAt)
	}
	text := &store.Response{Status: 200, Body: []byte("plain")}
	op.Result.ContentType = "text/plain"
	if v := Of("/ops", op, text, t0.Add(3*time.Second)); v.Response.Body != nil {
		t.Fatalf("a non-JSON result is inlined: %s", v.Response.Body)
	}
}

func TestExpiredOperationChangedWhenItsRetentionRanOut(t *testing.T) {
	op := &store.Operation{ID: "op_3", Status: store.StatusSucceeded, SubmittedAt: t0,
		FinishedAt: t0.Add(time.Second), Retention: time.Minute, Version: 4,
		Result: &store.ResultMeta{Status: 200, ContentType: "application/json"}}
	v := Of("/ops", op, nil, t0.Add(time.Hour))
	if v.Status != store.StatusExpired || v.Version != 5 || v.Response != nil {
		t.Fatalf("view = %+v", v)
	}
	if !v.UpdatedAt.Equal(t0.Add(time.Second + time.Minute)) {
		t.Fatalf("updated_at = %v", v.UpdatedAt)
	}
}

func TestViewEncodesTheDocumentedFieldNames(t *testing.T) {
	b, err := json.Marshal(Of("/ops", &store.Operation{ID: "op_4", Status: store.StatusRunning, SubmittedAt: t0}, nil, t0))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"operation_id", "status", "done", "links", "response", "error", "started_at", "retry_after"} {
		if _, ok := m[k]; !ok {
			t.Errorf("%s missing from %s", k, b)
		}
	}
}

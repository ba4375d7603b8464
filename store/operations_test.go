package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"
)

func TestStateMachineRefusesIllegalTransitions(t *testing.T) {
	all := []Status{StatusQueued, StatusRunning, StatusSucceeded, StatusFailed, StatusCanceled, StatusExpired}
	allowed := map[[2]Status]bool{
		{StatusQueued, StatusRunning}: true, {StatusQueued, StatusCanceled}: true,
		{StatusRunning, StatusSucceeded}: true, {StatusRunning, StatusFailed}: true,
		{StatusRunning, StatusCanceled}: true, {StatusRunning, StatusQueued}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got := CanTransition(from, to); got != allowed[[2]Status{from, to}] {
				t.Errorf("%s -> %s: allowed=%v", from, to, got)
			}
		}
	}
	for _, s := range all {
		if s.Final() && CanTransition(s, StatusQueued) {
			t.Errorf("final %s can move", s)
		}
	}
}

func newOp(id string) *Operation {
	return &Operation{ID: id, Scope: "scope", Status: StatusQueued, Version: 1, Method: "POST", Path: "/v1/x",
		SubmittedAt: time.Now(), Retention: time.Hour}
}

func TestOperationLifecycle(t *testing.T) {
	st := openTemp(t, true)
	req := &Request{Method: "POST", URL: "/v1/x?a=1", Header: http.Header{"A": {"b"}}, Body: []byte("payload")}
	for i := range 3 {
		if _, err := st.AcceptOperation(newOp(fmt.Sprintf("op_%d", i)), req, nil); err != nil {
			t.Fatal(err)
		}
	}
	if ids, _ := st.OperationsIn(StatusQueued); len(ids) != 3 || ids[0] != "op_0" {
		t.Fatalf("queue %v", ids)
	}
	op, err := st.Transition("op_0", Change{To: StatusRunning})
	if err != nil || op.ID != "op_0" || op.Status != StatusRunning || op.Version != 2 || op.Attempts != 1 {
		t.Fatalf("next: %+v %v", op, err)
	}
	got, err := st.LoadRequest("op_0")
	if err != nil || string(got.Body) != "payload" || got.Header.Get("A") != "b" {
		t.Fatalf("request: %+v %v", got, err)
	}
	res := &Response{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":1}`)}
	op, err = st.Transition("op_0", Change{To: StatusSucceeded, Result: res})
	if err != nil || op.Version != 3 || op.Result.Status != 200 || op.FinishedAt.IsZero() {
		t.Fatalf("succeed: %+v %v", op, err)
	}
	if _, err := st.Transition("op_0", Change{To: StatusFailed}); !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("a final operation moved: %v", err)
	}
	if r, err := st.LoadResult("op_0"); err != nil || string(r.Body) != `{"ok":1}` {
		t.Fatalf("result: %v", err)
	}
	if _, err := st.LoadRequest("op_0"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the request outlived the operation: %v", err)
	}
	if _, err := st.Transition("op_1", Change{To: StatusCanceled}); err != nil {
		t.Fatal(err)
	}
	if ids, _ := st.OperationsIn(StatusQueued); len(ids) != 1 || ids[0] != "op_2" {
		t.Fatalf("queue after cancel %v", ids)
	}
	list, _, _ := st.ListOperations("scope", "", "", 10)
	if len(list) != 3 || list[0].ID != "op_2" || list[2].ID != "op_0" {
		t.Fatalf("list newest first: %v", ids(list))
	}
	page, next, _ := st.ListOperations("scope", "", "op_2", 1)
	if len(page) != 1 || page[0].ID != "op_1" || next != "op_1" {
		t.Fatalf("page after op_2: %v, next %q", ids(page), next)
	}
	if rest, next, _ := st.ListOperations("scope", "", "op_1", 10); len(rest) != 1 || next != "" {
		t.Fatalf("last page: %v, next %q", ids(rest), next)
	}
	if other, _, _ := st.ListOperations("other", "", "", 10); len(other) != 0 {
		t.Fatal("another scope saw operations")
	}
	if q, _, _ := st.ListOperations("scope", StatusQueued, "", 10); len(q) != 1 || q[0].ID != "op_2" {
		t.Fatalf("status filter: %v", ids(q))
	}
}

func TestFinalOperationReadsExpiredAfterRetention(t *testing.T) {
	op := newOp("op")
	op.Status, op.FinishedAt, op.Version = StatusSucceeded, time.Now().Add(-2*time.Hour), 3
	op.Result = &ResultMeta{Status: 200}
	got := op.As(time.Now())
	if got.Status != StatusExpired || got.Version != 4 || got.Result != nil {
		t.Fatalf("%+v", got)
	}
	if op.As(op.FinishedAt.Add(time.Minute)).Status != StatusSucceeded {
		t.Fatal("expired within retention")
	}
}

func TestAcceptWithKeyCompletesTheKeyInTheSameTransaction(t *testing.T) {
	st := openTemp(t, true)
	k := &KeyAccept{Key: keyA, Fingerprint: fpA, Response: Response{Status: 202, Body: []byte(`{"operation_id":"op_a"}`)}, Expires: time.Now().Add(time.Hour)}
	if c, err := st.AcceptOperation(newOp("op_a"), &Request{}, k); err != nil || c.Outcome != Claimed {
		t.Fatalf("%v %v", c.Outcome, err)
	}
	c, err := st.AcceptOperation(newOp("op_b"), &Request{}, k)
	if err != nil || c.Outcome != Replay || c.Record.OperationID != "op_a" {
		t.Fatalf("retry: %v %+v %v", c.Outcome, c.Record, err)
	}
	if _, err := st.GetOperation("op_b"); !errors.Is(err, ErrNotFound) {
		t.Fatal("the retry created a second operation")
	}
}

func ids(ops []*Operation) []string {
	var out []string
	for _, o := range ops {
		out = append(out, o.ID)
	}
	return out
}

func TestOperationStoredWithoutUrgencyReadsAsTheDefault(t *testing.T) {
	var old, set Operation
	if err := json.Unmarshal([]byte(`{"id":"op_1","status":"queued"}`), &old); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"id":"op_2","status":"queued","urgency":0}`), &set); err != nil {
		t.Fatal(err)
	}
	if old.Urgency != DefaultUrgency || old.ID != "op_1" || set.Urgency != 0 {
		t.Fatalf("without urgency %d (want %d), with urgency 0: %d", old.Urgency, DefaultUrgency, set.Urgency)
	}
}

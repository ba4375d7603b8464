package badger

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/mulligan-gw/mulligan/store"
)

func newOp(id string) *store.Operation {
	return &store.Operation{ID: id, Scope: "scope", Status: store.StatusQueued, Version: 1, Method: "POST", Path: "/v1/x",
		SubmittedAt: time.Now(), Retention: time.Hour}
}

func TestOperationLifecycle(t *testing.T) {
	st := openTemp(t, true)
	req := &store.Request{Method: "POST", URL: "/v1/x?a=1", Header: http.Header{"A": {"b"}}, Body: []byte("payload")}
	for i := range 3 {
		if _, err := st.AcceptOperation(newOp(fmt.Sprintf("op_%d", i)), req, nil); err != nil {
			t.Fatal(err)
		}
	}
	if ids, _ := st.OperationsIn(store.StatusQueued); len(ids) != 3 || ids[0] != "op_0" {
		t.Fatalf("queue %v", ids)
	}
	op, err := st.Transition("op_0", store.Change{To: store.StatusRunning})
	if err != nil || op.ID != "op_0" || op.Status != store.StatusRunning || op.Version != 2 || op.Attempts != 1 {
		t.Fatalf("next: %+v %v", op, err)
	}
	got, err := st.LoadRequest("op_0")
	if err != nil || string(got.Body) != "payload" || got.Header.Get("A") != "b" {
		t.Fatalf("request: %+v %v", got, err)
	}
	res := &store.Response{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":1}`)}
	op, err = st.Transition("op_0", store.Change{To: store.StatusSucceeded, Result: res})
	if err != nil || op.Version != 3 || op.Result.Status != 200 || op.FinishedAt.IsZero() {
		t.Fatalf("succeed: %+v %v", op, err)
	}
	if _, err := st.Transition("op_0", store.Change{To: store.StatusFailed}); !errors.Is(err, store.ErrIllegalTransition) {
		t.Fatalf("a final operation moved: %v", err)
	}
	if r, err := st.LoadResult("op_0"); err != nil || string(r.Body) != `{"ok":1}` {
		t.Fatalf("result: %v", err)
	}
	if _, err := st.LoadRequest("op_0"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the request outlived the operation: %v", err)
	}
	if _, err := st.Transition("op_1", store.Change{To: store.StatusCanceled}); err != nil {
		t.Fatal(err)
	}
	if ids, _ := st.OperationsIn(store.StatusQueued); len(ids) != 1 || ids[0] != "op_2" {
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
	if q, _, _ := st.ListOperations("scope", store.StatusQueued, "", 10); len(q) != 1 || q[0].ID != "op_2" {
		t.Fatalf("status filter: %v", ids(q))
	}
}

func TestFinalOperationReadsExpiredAfterRetention(t *testing.T) {
	op := newOp("op")
	op.Status, op.FinishedAt, op.Version = store.StatusSucceeded, time.Now().Add(-2*time.Hour), 3
	op.Result = &store.ResultMeta{Status: 200}
	got := op.As(time.Now())
	if got.Status != store.StatusExpired || got.Version != 4 || got.Result != nil {
		t.Fatalf("%+v", got)
	}
	if op.As(op.FinishedAt.Add(time.Minute)).Status != store.StatusSucceeded {
		t.Fatal("expired within retention")
	}
}

func TestAcceptWithKeyCompletesTheKeyInTheSameTransaction(t *testing.T) {
	st := openTemp(t, true)
	k := &store.KeyAccept{Key: keyA, Fingerprint: fpA, Response: store.Response{Status: 202, Body: []byte(`{"operation_id":"op_a"}`)}, Expires: time.Now().Add(time.Hour)}
	if c, err := st.AcceptOperation(newOp("op_a"), &store.Request{}, k); err != nil || c.Outcome != store.Claimed {
		t.Fatalf("%v %v", c.Outcome, err)
	}
	c, err := st.AcceptOperation(newOp("op_b"), &store.Request{}, k)
	if err != nil || c.Outcome != store.Replay || c.Record.OperationID != "op_a" {
		t.Fatalf("retry: %v %+v %v", c.Outcome, c.Record, err)
	}
	if _, err := st.GetOperation("op_b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("the retry created a second operation")
	}
}

func ids(ops []*store.Operation) []string {
	var out []string
	for _, o := range ops {
		out = append(out, o.ID)
	}
	return out
}

// An operation a release before the binary form stored as JSON is read as it was, and its next
// change is stored in the binary form (docs/backends.md, "Operations on disk").
func TestOperationStoredAsJSONIsReadAndRewritten(t *testing.T) {
	st := openTemp(t, true)
	old := newOp("op_json")
	old.Exec = &store.Execution{Retries: 2, Events: []string{"operation.succeeded"}}
	v, err := store.Encode(old, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.sh.db.Update(func(txn *badger.Txn) error {
		if err := txn.Set(operationKey(old.ID), v); err != nil {
			return err
		}
		return txn.Set(requestKey(old.ID), mustEncode(t, &store.Request{Method: "POST", Header: http.Header{"A": {"b"}}, Body: []byte("payload")}))
	}); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetOperation(old.ID)
	if err != nil || got.Scope != "scope" || got.Exec.Retries != 2 || !got.SubmittedAt.Equal(old.SubmittedAt) {
		t.Fatalf("read %+v, %v", got, err)
	}
	if req, err := st.LoadRequest(old.ID); err != nil || req.Method != "POST" || req.Header.Get("A") != "b" || string(req.Body) != "payload" {
		t.Fatalf("the JSON request reads as %+v, %v", req, err)
	}
	if _, err := st.Transition(old.ID, store.Change{To: store.StatusCanceled}); err != nil {
		t.Fatal(err)
	}
	err = st.sh.db.View(func(txn *badger.Txn) error {
		return getValue(txn, operationKey(old.ID), func(v []byte) error {
			if bytes.HasPrefix(v, []byte{1}) { // Encode's version byte
				return fmt.Errorf("still JSON: %q", v)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := st.GetOperation(old.ID); err != nil || got.Status != store.StatusCanceled || got.Exec.Events[0] != "operation.succeeded" {
		t.Fatalf("after the change: %+v, %v", got, err)
	}
}

// A result a release before the binary form stored as JSON reads as it was.
func TestResultStoredAsJSONIsRead(t *testing.T) {
	st := openTemp(t, true)
	op := newOp("op_done")
	if _, err := st.AcceptOperation(op, &store.Request{Method: "POST"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Transition(op.ID, store.Change{To: store.StatusRunning}); err != nil {
		t.Fatal(err)
	}
	res := &store.Response{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":1}`)}
	if _, err := st.Transition(op.ID, store.Change{To: store.StatusSucceeded, Result: res}); err != nil {
		t.Fatal(err)
	}
	old, err := store.Encode(res, res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.sh.db.Update(func(txn *badger.Txn) error { return txn.Set(resultKey(op.ID), old) }); err != nil {
		t.Fatal(err)
	}
	got, err := st.LoadResult(op.ID)
	if err != nil || got.Status != 200 || got.Header.Get("Content-Type") != "application/json" || string(got.Body) != `{"ok":1}` {
		t.Fatalf("the JSON result reads as %+v, %v", got, err)
	}
}

func mustEncode(t *testing.T, req *store.Request) []byte {
	t.Helper()
	v, err := store.Encode(req, req.Body)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

package storetest

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

var operationTests = []test{
	{"AcceptWithKeyStoresTheOperationAndCompletesTheKeyInOneTransaction", testAcceptWithKey},
	{"AcceptOfAConvertedCallCompletesItsHeldKey", testAcceptConverted},
	{"StateMachineRefusesIllegalTransitions", testStateMachine},
	{"FinalStatusStoresTheResultAndDropsTheRequest", testFinalStoresResult},
	{"RecordAttemptLeavesFinalOperationsAlone", testRecordAttempt},
	{"CancelRequestIsRecordedOnce", testRequestCancel},
	{"ListPagesNewestFirstAndKeepsScopesApart", testList},
	{"FinalOperationExpiresAfterItsRetention", testRetention},
	{"UnknownOperationIsNotFound", testNotFound},
	{"OperationKeepsWhatItCarriesAndWhenItLastChanged", testCarriedFields},
}

// testCarriedFields: what an operation carries from its request (type, metadata, trace, its
// block's retry_on) reads back as stored, and every change moves updated_at (docs/api.md).
func testCarriedFields(t *testing.T, e *env) {
	b := e.open()
	op := e.newOp(0, "s")
	op.Type, op.Metadata, op.UpdatedAt = "chat_completion", []byte(`{"job":"j-1"}`), op.SubmittedAt
	op.Traceparent, op.Tracestate = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "congo=t61rcWkgMzE"
	op.Exec = &store.Execution{Timeout: time.Minute, Retries: 2, RetryOn: []int{500, 503}}
	must(b.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil))(t)
	got := must(b.GetOperation(opID(0)))(t)
	if got.Type != op.Type || string(got.Metadata) != string(op.Metadata) || got.Traceparent != op.Traceparent ||
		got.Tracestate != op.Tracestate || got.Exec == nil || !slices.Equal(got.Exec.RetryOn, op.Exec.RetryOn) {
		t.Fatalf("read back %+v", got)
	}
	steps := []struct {
		name   string
		change func() (*store.Operation, error)
	}{
		{"claim", func() (*store.Operation, error) { return b.ClaimNext("w1", time.Minute) }},
		{"attempt", func() (*store.Operation, error) { return b.RecordAttempt(opID(0)) }},
		{"cancel request", func() (*store.Operation, error) { return b.RequestCancel(opID(0), e.clock.Now()) }},
		{"final", func() (*store.Operation, error) {
			return b.Transition(opID(0), store.Change{To: store.StatusCanceled, Holder: "w1"})
		}},
	}
	for _, step := range steps {
		e.clock.Advance(time.Second)
		changed := must(step.change())(t)
		stored := must(b.GetOperation(opID(0)))(t)
		if !changed.UpdatedAt.Equal(e.clock.Now()) || !stored.UpdatedAt.Equal(e.clock.Now()) {
			t.Fatalf("%s: updated_at %v (stored %v), want %v", step.name, changed.UpdatedAt, stored.UpdatedAt, e.clock.Now())
		}
	}
}

func testAcceptWithKey(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	k := &store.KeyAccept{Key: keyA, Fingerprint: fpA, Expires: e.clock.Now().Add(time.Hour),
		Response: store.Response{Status: 202, Header: http.Header{"Location": {"/ops/op_000000"}}, Body: []byte(`{"id":"op_000000"}`)}}
	req := &store.Request{Method: "POST", URL: "/v1/x?a=1", Host: "h", Header: http.Header{"A": {"b"}}, Body: []byte("payload")}
	if c := must(a.AcceptOperation(e.newOp(0, "s"), req, k))(t); c.Outcome != store.Claimed {
		t.Fatalf("accept: %v", c.Outcome)
	}
	c := must(b.AcceptOperation(e.newOp(1, "s"), req, k))(t)
	if c.Outcome != store.Replay || c.Record.OperationID != opID(0) || c.Record.Response.Status != 202 {
		t.Fatalf("retry: %v %+v", c.Outcome, c.Record)
	}
	if _, err := b.GetOperation(opID(1)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the retry created a second operation: %v", err)
	}
	k.Fingerprint = fpB
	if c := must(b.AcceptOperation(e.newOp(2, "s"), req, k))(t); c.Outcome != store.Mismatch {
		t.Fatalf("other body: %v", c.Outcome)
	}
	got := must(b.LoadRequest(opID(0)))(t)
	if got.Method != "POST" || got.URL != "/v1/x?a=1" || got.Header.Get("A") != "b" || string(got.Body) != "payload" {
		t.Fatalf("request: %+v", got)
	}
	if queued, _ := pair(b.QueueStats())(t); queued != 1 {
		t.Fatalf("queued %d, want 1", queued)
	}
}

// A call converted to an operation after it started already holds its key: accepting it
// completes that claim with the 202, and the operation is stored running, held by its worker.
func testAcceptConverted(t *testing.T, e *env) {
	b := e.open()
	claim := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	op := e.newOp(0, "s")
	op.Status, op.StartedAt, op.Attempts = store.StatusRunning, e.clock.Now(), 1
	op.Holder, op.LeaseUntil = "w1", e.clock.Now().Add(time.Minute)
	k := &store.KeyAccept{Key: keyA, Fingerprint: fpA, Token: claim.Token, Expires: e.clock.Now().Add(time.Hour), Response: store.Response{Status: 202}}
	if c := must(b.AcceptOperation(op, &store.Request{}, k))(t); c.Outcome != store.Claimed {
		t.Fatalf("accept: %v", c.Outcome)
	}
	if rec := must(b.LookupKey(keyA))(t); rec.State != store.Completed || rec.OperationID != opID(0) {
		t.Fatalf("key: %+v", rec)
	}
	if _, running := pair(b.QueueStats())(t); running != 1 {
		t.Fatalf("running %d, want 1", running)
	}
	if exp := must(b.ExpiredLeases(10))(t); len(exp) != 0 {
		t.Fatalf("a live worker's converted call expired: %v", ids(exp))
	}
	if _, err := b.Transition(opID(0), store.Change{To: store.StatusSucceeded, Holder: "w1"}); err != nil {
		t.Fatal(err)
	}
	// A stale token completes nothing and stores nothing.
	k2 := &store.KeyAccept{Key: []byte("another-key-another-key-another-"), Fingerprint: fpA, Token: "stale", Expires: e.clock.Now().Add(time.Hour)}
	if _, err := b.AcceptOperation(e.newOp(1, "s"), &store.Request{}, k2); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("stale token: %v, want ErrNotHolder", err)
	}
	if _, err := b.GetOperation(opID(1)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused accept stored its operation: %v", err)
	}
}

func testStateMachine(t *testing.T, e *env) {
	all := []store.Status{store.StatusQueued, store.StatusRunning, store.StatusSucceeded, store.StatusFailed, store.StatusCanceled}
	b := e.open()
	n := 0
	for _, from := range all {
		for _, to := range append(slices.Clone(all), store.StatusExpired) {
			t.Run(fmt.Sprintf("%s->%s", from, to), func(t *testing.T) {
				id := reach(t, e, b, n, from)
				n++
				before := must(b.GetOperation(id))(t)
				op, err := b.Transition(id, store.Change{To: to})
				if store.CanTransition(from, to) {
					if err != nil || op.Status != to || op.Version != before.Version+1 {
						t.Fatalf("allowed move: %+v %v", op, err)
					}
					return
				}
				if !errors.Is(err, store.ErrIllegalTransition) {
					t.Fatalf("illegal move: %v, want ErrIllegalTransition", err)
				}
				if after := must(b.GetOperation(id))(t); after.Status != from || after.Version != before.Version {
					t.Fatalf("a refused move changed the operation: %+v", after)
				}
			})
		}
	}
}

// reach makes operation i of the test and walks it to status by legal moves.
func reach(t *testing.T, e *env, b store.Backend, i int, status store.Status) string {
	t.Helper()
	e.accept(t, b, "s", i, 1)
	id := opID(i)
	path := map[store.Status][]store.Status{
		store.StatusQueued:    nil,
		store.StatusRunning:   {store.StatusRunning},
		store.StatusSucceeded: {store.StatusRunning, store.StatusSucceeded},
		store.StatusFailed:    {store.StatusRunning, store.StatusFailed},
		store.StatusCanceled:  {store.StatusCanceled},
	}[status]
	for _, s := range path {
		if _, err := b.Transition(id, store.Change{To: s}); err != nil {
			t.Fatalf("%s -> %s: %v", id, s, err)
		}
	}
	return id
}

func testFinalStoresResult(t *testing.T, e *env) {
	b := e.open()
	e.accept(t, b, "s", 0, 1)
	op := must(b.ClaimNext("w1", time.Minute))(t)
	if op.Status != store.StatusRunning || op.Version != 2 || op.Attempts != 1 || op.Holder != "w1" || !op.StartedAt.Equal(e.clock.Now()) {
		t.Fatalf("claimed: %+v", op)
	}
	e.clock.Advance(time.Second)
	res := &store.Response{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":1}`)}
	op = must(b.Transition(op.ID, store.Change{To: store.StatusSucceeded, Result: res, Holder: "w1"}))(t)
	if op.Version != 3 || op.Result == nil || op.Result.Status != 200 || op.Result.Size != 8 || op.Result.ContentType != "application/json" ||
		!op.FinishedAt.Equal(e.clock.Now()) || op.Holder != "" {
		t.Fatalf("succeeded: %+v", op)
	}
	if got := must(b.GetOperation(op.ID))(t); got.Version != 3 || got.Status != store.StatusSucceeded || got.Result.Status != 200 {
		t.Fatalf("read back: %+v", got)
	}
	if r := must(b.LoadResult(op.ID))(t); r.Status != 200 || string(r.Body) != `{"ok":1}` || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("result: %+v", r)
	}
	if _, err := b.LoadRequest(op.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the request outlived the operation: %v", err)
	}
	// A failure keeps its error, and its upstream response when there was one.
	e.accept(t, b, "s", 1, 1)
	must(b.ClaimNext("w1", time.Minute))(t)
	failed := must(b.Transition(opID(1), store.Change{To: store.StatusFailed, Error: &store.OperationError{Code: "UPSTREAM_ERROR", Message: "m", Retryable: true}}))(t)
	if failed.Error == nil || failed.Error.Code != "UPSTREAM_ERROR" || !failed.Error.Retryable || failed.Result != nil {
		t.Fatalf("failed: %+v", failed)
	}
	if _, err := b.LoadResult(opID(1)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a result without a response: %v", err)
	}
}

func testRecordAttempt(t *testing.T, e *env) {
	b := e.open()
	e.accept(t, b, "s", 0, 1)
	must(b.ClaimNext("w1", time.Minute))(t)
	if op := must(b.RecordAttempt(opID(0)))(t); op.Attempts != 2 {
		t.Fatalf("attempts %d, want 2", op.Attempts)
	}
	final := must(b.Transition(opID(0), store.Change{To: store.StatusFailed}))(t)
	op := must(b.RecordAttempt(opID(0)))(t)
	if op.Attempts != final.Attempts || op.Version != final.Version || op.Status != store.StatusFailed {
		t.Fatalf("a final operation changed: %+v", op)
	}
	if got := must(b.GetOperation(opID(0)))(t); got.Attempts != final.Attempts {
		t.Fatalf("stored attempts %d, want %d", got.Attempts, final.Attempts)
	}
}

func testRequestCancel(t *testing.T, e *env) {
	b := e.open()
	e.accept(t, b, "s", 0, 1)
	at := e.clock.Now()
	op := must(b.RequestCancel(opID(0), at))(t)
	if !op.CancelRequestedAt.Equal(at) || op.Version != 2 {
		t.Fatalf("first request: %+v", op)
	}
	e.clock.Advance(time.Second)
	if again := must(b.RequestCancel(opID(0), e.clock.Now()))(t); !again.CancelRequestedAt.Equal(at) || again.Version != 2 {
		t.Fatalf("second request moved it: %+v", again)
	}
	must(b.Transition(opID(0), store.Change{To: store.StatusCanceled}))(t)
	done := must(b.RequestCancel(opID(0), e.clock.Now()))(t)
	if done.Status != store.StatusCanceled || done.Version != 3 {
		t.Fatalf("final: %+v", done)
	}
	if _, err := b.RequestCancel("op_missing", at); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}
}

func testList(t *testing.T, e *env) {
	b := e.open()
	e.accept(t, b, "a", 0, 5)
	e.accept(t, b, "b", 5, 2)
	must(b.Transition(opID(1), store.Change{To: store.StatusCanceled}))(t)
	var seen []string
	after := ""
	for range 10 {
		page, next := pair(b.ListOperations("a", "", after, 2))(t)
		seen = append(seen, ids(page)...)
		if next == "" {
			break
		}
		after = next
	}
	if want := []string{opID(4), opID(3), opID(2), opID(1), opID(0)}; !slices.Equal(seen, want) {
		t.Fatalf("pages of a: %v, want %v", seen, want)
	}
	if other, _ := pair(b.ListOperations("b", "", "", 10))(t); !slices.Equal(ids(other), []string{opID(6), opID(5)}) {
		t.Fatalf("scope b: %v", ids(other))
	}
	if none, next := pair(b.ListOperations("c", "", "", 10))(t); len(none) != 0 || next != "" {
		t.Fatalf("scope c: %v %q", ids(none), next)
	}
	if canceled, _ := pair(b.ListOperations("a", store.StatusCanceled, "", 10))(t); !slices.Equal(ids(canceled), []string{opID(1)}) {
		t.Fatalf("canceled in a: %v", ids(canceled))
	}
	all, _ := pair(b.ListAllOperations(store.StatusQueued, "", 10))(t)
	if want := []string{opID(6), opID(5), opID(4), opID(3), opID(2), opID(0)}; !slices.Equal(ids(all), want) {
		t.Fatalf("queued everywhere: %v, want %v", ids(all), want)
	}
	if n := must(b.ActiveCount("a"))(t); n != 4 {
		t.Fatalf("active in a: %d, want 4", n)
	}
}

// Past its retention a final operation reads as expired (store.Operation.As), its result is
// gone, and it lists as expired.
func testRetention(t *testing.T, e *env) {
	b := e.open()
	e.accept(t, b, "s", 0, 1)
	must(b.ClaimNext("w1", time.Minute))(t)
	must(b.Transition(opID(0), store.Change{To: store.StatusSucceeded, Result: &store.Response{Status: 200, Body: []byte("r")}}))(t)
	e.clock.Advance(59 * time.Minute)
	if _, err := b.LoadResult(opID(0)); err != nil {
		t.Fatalf("within retention: %v", err)
	}
	e.clock.Advance(2 * time.Minute)
	if _, err := b.LoadResult(opID(0)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("past retention the result is read: %v", err)
	}
	op := must(b.GetOperation(opID(0)))(t)
	if got := op.As(e.clock.Now()); got.Status != store.StatusExpired || got.Result != nil {
		t.Fatalf("past retention: %+v", got)
	}
	if exp, _ := pair(b.ListOperations("s", store.StatusExpired, "", 10))(t); !slices.Equal(ids(exp), []string{opID(0)}) {
		t.Fatalf("listed expired: %v", ids(exp))
	}
	if done, _ := pair(b.ListOperations("s", store.StatusSucceeded, "", 10))(t); len(done) != 0 {
		t.Fatalf("listed succeeded past retention: %v", ids(done))
	}
}

func testNotFound(t *testing.T, e *env) {
	b := e.open()
	if _, err := b.GetOperation("op_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get: %v", err)
	}
	if _, err := b.Transition("op_missing", store.Change{To: store.StatusRunning}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("transition: %v", err)
	}
	if _, err := b.LoadRequest("op_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("request: %v", err)
	}
	if _, err := b.LoadResult("op_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("result: %v", err)
	}
}

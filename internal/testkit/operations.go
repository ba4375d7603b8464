package testkit

import (
	"net/http"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// ChatPath is where the operations QueueChat stores post.
const ChatPath = "/v1/chat/completions"

// QueueChat stores op as a queued chat completion of scope "s", submitted at now and kept an
// hour, its request posting body as JSON with header; the caller then tells its runner.
func QueueChat(t testing.TB, st store.Backend, op *store.Operation, now time.Time, header http.Header, body string) {
	t.Helper()
	op.Scope, op.Status, op.Version, op.Method, op.Path = "s", store.StatusQueued, 1, "POST", ChatPath
	op.SubmittedAt, op.Retention, op.Urgency = now, time.Hour, store.DefaultUrgency
	req := &store.Request{Method: "POST", URL: ChatPath, Host: "gateway.test", Header: header.Clone(), Body: []byte(body)}
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("Content-Type", "application/json")
	if _, err := st.AcceptOperation(op, req, nil); err != nil {
		t.Fatal(err)
	}
}

// AwaitFinal waits, bounded by 30 s, for operation id to reach a final status, and returns it.
func AwaitFinal(t testing.TB, st store.Operations, id string) *store.Operation {
	t.Helper()
	var op *store.Operation
	WaitFor(t, 30*time.Second, "operation "+id+" final", func() bool {
		got, err := st.GetOperation(id)
		op = got
		return err == nil && got.Status.Final()
	})
	return op
}

// AwaitEvent waits, bounded by 10 s, until the outbox's copy of event id satisfies cond (what
// names the wait), and returns it.
func AwaitEvent(t testing.TB, st store.Outbox, id, what string, cond func(*store.Event) bool) *store.Event {
	t.Helper()
	var ev *store.Event
	WaitFor(t, 10*time.Second, what, func() bool {
		got, err := st.GetEvent(id)
		ev = got
		return err == nil && cond(got)
	})
	return ev
}

// Queue puts chat operations in a store for a runner under test, telling the runner of each
// (Told: its Accepted), and waits for them to end.
type Queue struct {
	St   store.Backend
	Now  func() time.Time // the runner's clock
	Told func()
}

// Accept queues operation id, run with ex, posting body to the chat path; events about it go
// to callback, if any.
func (q Queue) Accept(t testing.TB, id string, ex store.Execution, callback *store.Callback, body string) {
	t.Helper()
	q.Put(t, &store.Operation{ID: id, Exec: &ex, Callback: callback}, nil, body)
}

// AcceptWith queues an operation as Accept does, its request carrying header.
func (q Queue) AcceptWith(t testing.TB, id string, ex store.Execution, header http.Header, body string) {
	t.Helper()
	q.Put(t, &store.Operation{ID: id, Exec: &ex}, header, body)
}

// Put queues op (QueueChat) and tells the runner.
func (q Queue) Put(t testing.TB, op *store.Operation, header http.Header, body string) {
	t.Helper()
	QueueChat(t, q.St, op, q.Now(), header, body)
	q.Told()
}

// Await waits for operation id to reach a final status (AwaitFinal), and returns it.
func (q Queue) Await(t testing.TB, id string) *store.Operation {
	t.Helper()
	return AwaitFinal(t, q.St, id)
}

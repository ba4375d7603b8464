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

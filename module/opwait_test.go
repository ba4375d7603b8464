package module

import (
	"bufio"
	"bytes"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// followInBackground asks for operation id's result as Server-Sent Events and sends the answer
// on the returned channel once it has ended.
func (g *gateway) followInBackground(id string) <-chan result {
	out := make(chan result, 1)
	go func() { out <- g.get("/v1/operations/"+id+"/result", "Accept", "text/event-stream") }()
	return out
}

// followWaiting is followInBackground once the follower waits for the answer to begin.
// Serial tests only: the count of waiters is the process's.
func (g *gateway) followWaiting(t *testing.T, id string) <-chan result {
	t.Helper()
	waiting := resultWaiters.Load()
	out := g.followInBackground(id)
	testkit.WaitFor(t, 5*time.Second, "the follower waits", func() bool { return resultWaiters.Load() > waiting })
	return out
}

// events reads the Server-Sent Events of an answer's body.
func (r result) events(t *testing.T) []sseEvent {
	t.Helper()
	if r.err != nil || r.StatusCode != 200 {
		t.Fatalf("follow answered %v %v: %s", r.Status, r.err, r.body)
	}
	evs, err := (&sseStream{rd: bufio.NewReader(bytes.NewReader(r.body))}).readAll()
	if err != nil {
		t.Fatalf("after %d events: %v", len(evs), err)
	}
	return evs
}

// A client that follows a job it just submitted, still queued behind the only runner slot,
// waits for its answer to begin and gets every event, instead of 409 OPERATION_NOT_FINISHED.
func TestFollowingAQueuedOperationWaitsForItsStream(t *testing.T) {
	up, g, queued := queuedBehindAHeldOne(t)
	if op := decodeOp(t, g.get(queued.StatusURL)); op.Status != "queued" {
		t.Fatalf("the second operation is %s, want queued", op.Status)
	}
	answer := g.followWaiting(t, queued.OperationID)
	up.release()
	checkEvents(t, (<-answer).events(t), 1, 20, 2, false)
}

// A follower of a running operation whose model has not sent its first token waits for the
// answer to begin, then gets its events.
func TestFollowingARunningOperationBeforeItsAnswerBeginsWaitsForIt(t *testing.T) {
	up, g := heldHeadGateway(t, 20)
	_, op := g.submit(t, "")
	testkit.WaitFor(t, 5*time.Second, "up.runs.Load() == 1", func() bool { return up.runs.Load() == 1 })
	answer := g.followWaiting(t, op.OperationID)
	up.release()
	checkEvents(t, (<-answer).events(t), 1, 20, 1, false)
}

// A queued operation canceled while a follower waits for its stream ends without one: the
// follower is answered what GET .../result answers for it (404, no upstream response); a
// result request without Accept: text/event-stream still gets 409 at once.
func TestFollowerOfAnOperationCanceledBeforeItsStreamGetsTheFinalAnswer(t *testing.T) {
	_, g, queued := queuedBehindAHeldOne(t)
	expectError(t, g.get("/v1/operations/"+queued.OperationID+"/result"), 409, apierr.CodeNotFinished, true)
	answer := g.followWaiting(t, queued.OperationID)
	if c := g.post(queued.Links.Cancel, "", ""); c.StatusCode != 200 {
		t.Fatalf("cancel: %d %s", c.StatusCode, c.body)
	}
	expectError(t, <-answer, 404, apierr.CodeOperationNotFound, false)
}

// queuedBehindAHeldOne starts a gateway with one runner slot in front of an upstream that holds
// its answer's head until released, and submits two operations: the first holds the slot, the
// second (returned) waits in the queue behind it.
func queuedBehindAHeldOne(t *testing.T) (*eventUpstream, *gateway, opBody) {
	up := newEventUpstream(20)
	up.holdHead = true
	g := startGatewayWith(t, gatewaySetup{upstream: up, mulligan: "async {\n concurrency 1\n}"})
	t.Cleanup(up.release)
	g.submit(t, "first")
	testkit.WaitFor(t, 5*time.Second, "the first operation at the model", func() bool { return up.runs.Load() == 1 })
	_, queued := g.submit(t, "queued")
	return up, g, queued
}

// A follower that saw an operation's stream begin, and finds it over by the time it is served
// (the attempt has ended; its final status may not be written yet), gets the whole answer
// instead of 409 OPERATION_NOT_FINISHED. Serial: it sets a package hook.
func TestFollowerWhoseStreamEndsAsItIsServedGetsTheWholeAnswer(t *testing.T) {
	up := newEventUpstream(20)
	up.head, up.holdAt = make(chan struct{}), 1
	g := startHandlerWith(t, gatewaySetup{upstream: up})
	t.Cleanup(up.release)
	_, op := g.submit(t, "")
	testkit.WaitFor(t, 5*time.Second, "up.runs.Load() == 1", func() bool { return up.runs.Load() == 1 })
	var s *storage
	g.registry().eachStorage(func(_ string, o *storage) bool { s = o; return false })
	live := func() bool { return s.run.StreamOf(op.OperationID) != nil }
	// The follower waits for the answer to begin; it begins (one event, then held) and, before
	// the follower is served, ends.
	testHookFollowerAwaited = func() {
		up.release()
		testkit.WaitFor(t, 5*time.Second, "the operation's stream has ended", func() bool { return !live() })
	}
	t.Cleanup(func() { testHookFollowerAwaited = nil })
	answer := g.followWaiting(t, op.OperationID)
	close(up.head)
	checkEvents(t, (<-answer).events(t), 1, 20, 1, false)
}

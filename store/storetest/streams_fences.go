package storetest

import (
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// streamFenceTests hold what a late or repeated call may not do to a recorded stream, and how
// its upstream ids are found (docs/streams.md).
var streamFenceTests = []test{
	{"AbortAfterFinishLeavesTheStreamReplaying", testAbortAfterFinishLeavesTheStreamReplaying},
	{"RepeatedUpstreamIDIsNotIndexed", testRepeatedUpstreamIDIsNotIndexed},
	{"DeepPageOfALongStreamReadsItsOwnEvents", testDeepPageOfALongStream},
}

// A finish whose commit landed but whose caller saw an error (a timeout during a slow fsync)
// is followed by an abort: the abort finds the key no longer in flight under its token and
// changes nothing, so the key goes on replaying the whole stream.
func testAbortAfterFinishLeavesTheStreamReplaying(t *testing.T, e *env) {
	b, sr, c := e.liveStream(t)
	ok(t, sr.AppendEvents(keyA, store.KeyHolder(c.Token), events(1, 5)))
	ok(t, sr.FinishStream(keyA, store.KeyHolder(c.Token), e.clock.Now().Add(time.Hour)))
	if err := sr.AbortStream(keyA, store.KeyHolder(c.Token)); err != nil {
		t.Fatalf("a late abort: %v", err)
	}
	if p := must(sr.ReadEvents(keyA, 0, 100))(t); p.State != store.StreamFinished || len(p.List) != 5 {
		t.Fatalf("after a late abort the stream reads %v with %d events, want finished with 5", p.State, len(p.List))
	}
	again := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if again.Outcome != store.Replay || !again.Record.Streamed {
		t.Fatalf("after a late abort the key is %v, want a replay of the stream", again.Outcome)
	}
}

// An upstream that repeats an event id makes the id ambiguous: it is found while it is unique
// in the stream and not after, on every backend alike, whether the repeat comes in the same
// batch or a later one. Unique ids go on being found.
func testRepeatedUpstreamIDIsNotIndexed(t *testing.T, e *env) {
	_, sr, c := e.liveStream(t)
	ev := func(id string) store.StreamEvent {
		return store.StreamEvent{ID: id, Data: []byte("id: " + id + "\n\n")}
	}
	ok(t, sr.AppendEvents(keyA, store.KeyHolder(c.Token), []store.StreamEvent{ev("a"), ev("b"), ev("b")}))
	if seq, found, _ := sr.FindEvent(keyA, "a"); !found || seq != 1 {
		t.Fatalf(`FindEvent("a") = %d %v, want 1`, seq, found)
	}
	ok(t, sr.AppendEvents(keyA, store.KeyHolder(c.Token), []store.StreamEvent{ev("c"), ev("a")}))
	for _, id := range []string{"a", "b"} {
		if seq, found, err := sr.FindEvent(keyA, id); found || err != nil {
			t.Errorf("FindEvent(%q) = %d %v %v: a repeated id was found", id, seq, found, err)
		}
	}
	if seq, found, _ := sr.FindEvent(keyA, "c"); !found || seq != 4 {
		t.Fatalf(`FindEvent("c") = %d %v, want 4`, seq, found)
	}
	ok(t, sr.AppendEvents(keyA, store.KeyHolder(c.Token), []store.StreamEvent{ev("a")}))
	if _, found, _ := sr.FindEvent(keyA, "a"); found {
		t.Error(`"a", seen a third time, was found again`)
	}
}

// A page deep in a stream of many batches holds exactly the events asked for.
func testDeepPageOfALongStream(t *testing.T, e *env) {
	_, sr, c := e.liveStream(t)
	for i := 1; i <= 300; i += 2 {
		ok(t, sr.AppendEvents(keyA, store.KeyHolder(c.Token), events(i, i+1)))
	}
	p := must(sr.ReadEvents(keyA, 250, 5))(t)
	if len(p.List) != 5 || p.List[0].Seq != 251 || p.List[4].Seq != 255 || p.List[0].ID != "251" {
		t.Fatalf("page after 250: %d events from %+v", len(p.List), p.List)
	}
	if p := must(sr.ReadEvents(keyA, 299, 5))(t); len(p.List) != 1 || p.List[0].Seq != 300 {
		t.Fatalf("page after 299: %+v", p.List)
	}
}

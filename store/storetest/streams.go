package storetest

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// streamTests hold backends that record event streams (store.StreamRecorder, see
// docs/streams.md) to their promises; a backend that records none skips them.
var streamTests = []test{
	{"FinishedStreamReplaysWholeInPages", testFinishedStreamReplaysWholeInPages},
	{"UpstreamEventIDsAreIndexed", testUpstreamEventIDsAreIndexed},
	{"AbortedStreamReleasesTheKeyAndIsNeverReplayed", testAbortedStreamReleasesTheKey},
	{"StreamOfACrashedGatewayReadsAsAborted", testStreamOfACrashedGatewayReadsAsAborted},
}

var sseHeader = http.Header{"Content-Type": {"text/event-stream"}}

// recorder returns a handle that records streams, or skips the test.
func (e *env) recorder(t *testing.T) (store.Backend, store.StreamRecorder) {
	t.Helper()
	b := e.open()
	sr, ok := b.(store.StreamRecorder)
	if !ok {
		t.Skip("the backend does not record streams (store.StreamRecorder)")
	}
	return b, sr
}

// events are the stream's events from..to, with gateway ids.
func events(from, to int) []store.StreamEvent {
	var out []store.StreamEvent
	for i := from; i <= to; i++ {
		out = append(out, store.StreamEvent{ID: fmt.Sprint(i), Data: fmt.Appendf(nil, "id: %d\ndata: %d\n\n", i, i)})
	}
	return out
}

// A stream appended in uneven batches reads back whole, in pages across the batches, and
// its key then replays it.
func testFinishedStreamReplaysWholeInPages(t *testing.T, e *env) {
	b, sr := e.recorder(t)
	c := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if err := sr.BeginStream(keyA, c.Token, 200, sseHeader, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, batch := range [][]store.StreamEvent{events(1, 3), events(4, 4), events(5, 20)} {
		if err := sr.AppendEvents(keyA, c.Token, batch); err != nil {
			t.Fatal(err)
		}
	}
	if p := must(sr.ReadEvents(keyA, 0, 0))(t); p.State != store.StreamLive || p.Events != 20 {
		t.Fatalf("live head: %+v", p)
	}
	if err := sr.FinishStream(keyA, c.Token, e.clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	again := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if again.Outcome != store.Replay || !again.Record.Streamed || again.Record.Response.Status != 200 {
		t.Fatalf("after finish: outcome %v streamed %v", again.Outcome, again.Record.Streamed)
	}
	var got []store.StreamEvent
	for after := uint64(2); ; {
		p := must(sr.ReadEvents(keyA, after, 7))(t)
		if p.State != store.StreamFinished {
			t.Fatalf("page after %d: %v", after, p.State)
		}
		if len(p.List) == 0 {
			break
		}
		got = append(got, p.List...)
		after = p.List[len(p.List)-1].Seq
	}
	if len(got) != 18 || got[0].Seq != 3 || got[0].ID != "3" || string(got[17].Data) != "id: 20\ndata: 20\n\n" {
		t.Fatalf("read %d events after 2: first %+v", len(got), got[0])
	}
	for i, ev := range got {
		if ev.Seq != uint64(i+3) {
			t.Fatalf("event %d has position %d", i+3, ev.Seq)
		}
	}
}

// The upstream's own event ids are found by id; gateway ids are positions.
func testUpstreamEventIDsAreIndexed(t *testing.T, e *env) {
	b, sr := e.recorder(t)
	c := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	_ = sr.BeginStream(keyA, c.Token, 200, sseHeader, time.Hour)
	_ = sr.AppendEvents(keyA, c.Token, []store.StreamEvent{{ID: "chatcmpl-a", Data: []byte("x")}, {ID: "2", Data: []byte("y")}, {ID: "chatcmpl-c", Data: []byte("z")}})
	for id, want := range map[string]uint64{"chatcmpl-a": 1, "2": 2, "chatcmpl-c": 3} {
		if seq, ok, err := sr.FindEvent(keyA, id); !ok || seq != want || err != nil {
			t.Errorf("FindEvent(%q) = %d %v %v, want %d", id, seq, ok, err, want)
		}
	}
	if _, ok, _ := sr.FindEvent(keyA, "9"); ok {
		t.Error("found an event past the end")
	}
}

// An aborted stream releases its key at once and is never replayed, nor finished later.
func testAbortedStreamReleasesTheKey(t *testing.T, e *env) {
	b, sr := e.recorder(t)
	c := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	_ = sr.BeginStream(keyA, c.Token, 200, sseHeader, time.Hour)
	_ = sr.AppendEvents(keyA, c.Token, events(1, 10))
	if err := sr.AbortStream(keyA, c.Token); err != nil {
		t.Fatal(err)
	}
	if p := must(sr.ReadEvents(keyA, 0, 100))(t); p.State != store.StreamAborted || len(p.List) != 0 {
		t.Fatalf("after abort: %v with %d events", p.State, len(p.List))
	}
	if again := must(b.ClaimKey(keyA, fpA, time.Minute))(t); again.Outcome != store.Claimed {
		t.Fatalf("after abort the key is %v, want claimable", again.Outcome)
	}
	if err := sr.FinishStream(keyA, c.Token, e.clock.Now().Add(time.Hour)); err == nil {
		t.Fatal("an aborted stream was finished")
	}
}

// A stream whose holder died (its claim's lease ran out) reads as aborted, and the next claim
// does not inherit it.
func testStreamOfACrashedGatewayReadsAsAborted(t *testing.T, e *env) {
	b, sr := e.recorder(t)
	c := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	_ = sr.BeginStream(keyA, c.Token, 200, sseHeader, time.Hour)
	_ = sr.AppendEvents(keyA, c.Token, events(1, 10))
	e.clock.Advance(2 * time.Minute)
	if p := must(sr.ReadEvents(keyA, 0, 100))(t); p.State != store.StreamAborted {
		t.Fatalf("a stream whose claim expired reads as %v", p.State)
	}
	next := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if next.Outcome != store.Claimed {
		t.Fatalf("the crashed stream's key is %v, want claimable", next.Outcome)
	}
	if p := must(sr.ReadEvents(keyA, 0, 100))(t); p.State == store.StreamLive || p.Token == next.Token {
		t.Fatalf("the new claim inherited the old stream: %+v", p)
	}
}

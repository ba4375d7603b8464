package storetest

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// streamTests hold backends to their promises as recorders of event streams
// (store.StreamRecorder, see docs/streams.md).
var streamTests = []test{
	{"FinishedStreamReplaysWholeInPages", testFinishedStreamReplaysWholeInPages},
	{"UpstreamEventIDsAreIndexed", testUpstreamEventIDsAreIndexed},
	{"AbortedStreamReleasesTheKeyAndIsNeverReplayed", testAbortedStreamReleasesTheKey},
	{"StreamOfACrashedGatewayReadsAsAborted", testStreamOfACrashedGatewayReadsAsAborted},
	{"LiveStreamIsFollowedThroughAnotherHandle", testLiveStreamIsFollowedThroughAnotherHandle},
	{"NextAttemptReplacesTheStreamAndFencesTheOld", testNextAttemptReplacesTheStream},
	{"EventIDsAndDataKeepTheirBytes", testEventIDsAndDataKeepTheirBytes},
	{"DroppedStreamReadsAsAbortedButKeepsItsClaim", testDroppedStreamKeepsItsClaim},
}

var sseHeader = http.Header{"Content-Type": {"text/event-stream"}}

// recorder returns a handle, and the same handle as the stream recorder it is.
func (e *env) recorder(t *testing.T) (store.Backend, store.StreamRecorder) {
	t.Helper()
	b := e.open()
	return b, b
}

// liveStream claims keyA on a handle that records streams and begins the key's stream.
func (e *env) liveStream(t *testing.T) (store.Backend, store.StreamRecorder, store.Claim) {
	t.Helper()
	b, sr := e.recorder(t)
	c := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if err := sr.BeginStream(keyA, store.KeyHolder(c.Token), 200, sseHeader, time.Hour); err != nil {
		t.Fatal(err)
	}
	return b, sr, c
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
	b, sr, c := e.liveStream(t)
	for _, batch := range [][]store.StreamEvent{events(1, 3), events(4, 4), events(5, 20)} {
		if err := sr.AppendEvents(keyA, store.KeyHolder(c.Token), batch); err != nil {
			t.Fatal(err)
		}
	}
	if p := must(sr.ReadEvents(keyA, 0, 0))(t); p.State != store.StreamLive || p.Events != 20 {
		t.Fatalf("live head: %+v", p)
	}
	if err := sr.FinishStream(keyA, store.KeyHolder(c.Token), e.clock.Now().Add(time.Hour)); err != nil {
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
	_, sr, c := e.liveStream(t)
	_ = sr.AppendEvents(keyA, store.KeyHolder(c.Token), []store.StreamEvent{{ID: "chatcmpl-a", Data: []byte("x")}, {ID: "2", Data: []byte("y")}, {ID: "chatcmpl-c", Data: []byte("z")}})
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
	b, sr, c := e.liveStream(t)
	_ = sr.AppendEvents(keyA, store.KeyHolder(c.Token), events(1, 10))
	if err := sr.AbortStream(keyA, store.KeyHolder(c.Token)); err != nil {
		t.Fatal(err)
	}
	if p := must(sr.ReadEvents(keyA, 0, 100))(t); p.State != store.StreamAborted || len(p.List) != 0 {
		t.Fatalf("after abort: %v with %d events", p.State, len(p.List))
	}
	if again := must(b.ClaimKey(keyA, fpA, time.Minute))(t); again.Outcome != store.Claimed {
		t.Fatalf("after abort the key is %v, want claimable", again.Outcome)
	}
	if err := sr.FinishStream(keyA, store.KeyHolder(c.Token), e.clock.Now().Add(time.Hour)); err == nil {
		t.Fatal("an aborted stream was finished")
	}
}

// A stream whose holder died (its claim's lease ran out) reads as aborted, and the next claim
// does not inherit it.
func testStreamOfACrashedGatewayReadsAsAborted(t *testing.T, e *env) {
	b, sr, c := e.liveStream(t)
	_ = sr.AppendEvents(keyA, store.KeyHolder(c.Token), events(1, 10))
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

// A stream written through one handle is followed through another (another replica, on
// PostgreSQL): live with the events so far, then finished, and the key replays there.
func testLiveStreamIsFollowedThroughAnotherHandle(t *testing.T, e *env) {
	b, sr := e.recorder(t)
	other := e.open()
	osr := other
	c := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if dup := must(other.ClaimKey(keyA, fpA, time.Minute))(t); dup.Outcome != store.InProgress {
		t.Fatalf("a duplicate on the other handle: %v", dup.Outcome)
	}
	hdr := http.Header{"Content-Type": {"text/event-stream"}, "X-Model": {"m1"}}
	_ = sr.BeginStream(keyA, store.KeyHolder(c.Token), 200, hdr, time.Hour)
	_ = sr.AppendEvents(keyA, store.KeyHolder(c.Token), events(1, 5))
	p := must(osr.ReadEvents(keyA, 0, 100))(t)
	if p.State != store.StreamLive || p.Token != c.Token || p.Events != 5 || len(p.List) != 5 || p.Header.Get("X-Model") != "m1" {
		t.Fatalf("the other handle reads %v, %d of %d events, header %v", p.State, len(p.List), p.Events, p.Header)
	}
	if seq, ok, _ := osr.FindEvent(keyA, "4"); !ok || seq != 4 {
		t.Fatalf("the other handle finds event 4 at %d %v", seq, ok)
	}
	_ = sr.AppendEvents(keyA, store.KeyHolder(c.Token), events(6, 8))
	if err := sr.FinishStream(keyA, store.KeyHolder(c.Token), e.clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	p = must(osr.ReadEvents(keyA, 5, 100))(t)
	if p.State != store.StreamFinished || p.Events != 8 || len(p.List) != 3 || p.List[0].Seq != 6 {
		t.Fatalf("after finish the other handle reads %v with %d events after 5", p.State, len(p.List))
	}
	if again := must(other.ClaimKey(keyA, fpA, time.Minute))(t); again.Outcome != store.Replay || !again.Record.Streamed {
		t.Fatalf("the other handle's claim after finish: %v streamed %v", again.Outcome, again.Record != nil && again.Record.Streamed)
	}
}

// When a crashed holder's claim is taken over, the next attempt's stream replaces the old one:
// the old attempt can neither start, append to nor finish a stream any more, and its events
// are not read as the new attempt's.
func testNextAttemptReplacesTheStream(t *testing.T, e *env) {
	b, sr := e.recorder(t)
	old := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	_ = sr.BeginStream(keyA, store.KeyHolder(old.Token), 200, sseHeader, time.Hour)
	_ = sr.AppendEvents(keyA, store.KeyHolder(old.Token), events(1, 6))
	e.clock.Advance(2 * time.Minute)
	next := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if next.Outcome != store.Claimed {
		t.Fatalf("takeover: %v", next.Outcome)
	}
	if err := sr.BeginStream(keyA, store.KeyHolder(old.Token), 200, sseHeader, time.Hour); err == nil {
		t.Fatal("the old attempt began a stream after losing its claim")
	}
	if err := sr.BeginStream(keyA, store.KeyHolder(next.Token), 201, sseHeader, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := sr.AppendEvents(keyA, store.KeyHolder(old.Token), events(7, 7)); err == nil {
		t.Fatal("the old attempt appended to the new attempt's stream")
	}
	_ = sr.AppendEvents(keyA, store.KeyHolder(next.Token), events(1, 2))
	if err := sr.FinishStream(keyA, store.KeyHolder(old.Token), e.clock.Now().Add(time.Hour)); err == nil {
		t.Fatal("the old attempt finished the new attempt's stream")
	}
	p := must(sr.ReadEvents(keyA, 0, 100))(t)
	if p.Token != next.Token || p.Status != 201 || p.Events != 2 || len(p.List) != 2 || p.State != store.StreamLive {
		t.Fatalf("the new attempt's stream reads %+v", p)
	}
	if _, ok, _ := sr.FindEvent(keyA, "5"); ok {
		t.Fatal("found the old attempt's event 5 in the new stream")
	}
}

// Event ids and data are kept byte for byte, whatever the bytes: an upstream's id need not
// be UTF-8.
func testEventIDsAndDataKeepTheirBytes(t *testing.T, e *env) {
	_, sr, c := e.liveStream(t)
	odd := []store.StreamEvent{
		{ID: "caf\xe9\x00", Data: []byte("id: caf\xe9\x00\ndata: \xff\x00\r\n\n")},
		{ID: "", Data: []byte{}},
		{ID: "3", Data: []byte("data: ok\n\n")},
	}
	if err := sr.AppendEvents(keyA, store.KeyHolder(c.Token), odd); err != nil {
		t.Fatal(err)
	}
	if seq, ok, err := sr.FindEvent(keyA, odd[0].ID); !ok || seq != 1 || err != nil {
		t.Fatalf("FindEvent of an odd id: %d %v %v", seq, ok, err)
	}
	p := must(sr.ReadEvents(keyA, 0, 10))(t)
	if len(p.List) != 3 {
		t.Fatalf("read %d events", len(p.List))
	}
	for i, ev := range p.List {
		if ev.ID != odd[i].ID || string(ev.Data) != string(odd[i].Data) {
			t.Errorf("event %d reads back as %q %q, want %q %q", i+1, ev.ID, ev.Data, odd[i].ID, odd[i].Data)
		}
	}
}

// A stream given up while it is still relayed reads as aborted at once, through every handle,
// with its events gone; its key stays claimed (the first client is still being served) until
// the attempt aborts, and it can no longer be appended to or finished.
func testDroppedStreamKeepsItsClaim(t *testing.T, e *env) {
	b, sr, c := e.liveStream(t)
	other := e.open()
	_ = sr.AppendEvents(keyA, store.KeyHolder(c.Token), events(1, 4))
	if err := sr.DropStream(keyA, store.KeyHolder(c.Token)); err != nil {
		t.Fatal(err)
	}
	if p := must(other.ReadEvents(keyA, 0, 100))(t); p.State != store.StreamAborted || len(p.List) != 0 {
		t.Fatalf("a dropped stream reads as %v with %d events through another handle", p.State, len(p.List))
	}
	if dup := must(other.ClaimKey(keyA, fpA, time.Minute))(t); dup.Outcome != store.InProgress {
		t.Fatalf("a dropped stream's key is %v, want still in progress", dup.Outcome)
	}
	if err := sr.AppendEvents(keyA, store.KeyHolder(c.Token), events(5, 5)); err == nil {
		t.Fatal("appended to a dropped stream")
	}
	if err := sr.FinishStream(keyA, store.KeyHolder(c.Token), e.clock.Now().Add(time.Hour)); err == nil {
		t.Fatal("finished a dropped stream")
	}
	if err := sr.AbortStream(keyA, store.KeyHolder(c.Token)); err != nil {
		t.Fatal(err)
	}
	if again := must(b.ClaimKey(keyA, fpA, time.Minute))(t); again.Outcome != store.Claimed {
		t.Fatalf("after the abort the key is %v, want claimable", again.Outcome)
	}
}

package store

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

var sseHeader = http.Header{"Content-Type": {"text/event-stream"}}

func events(from, to int) []StreamEvent {
	var out []StreamEvent
	for i := from; i <= to; i++ {
		out = append(out, StreamEvent{ID: fmt.Sprint(i), Data: fmt.Appendf(nil, "id: %d\ndata: %d\n\n", i, i)})
	}
	return out
}

func TestFinishedStreamReplaysWholeInPages(t *testing.T) {
	st := openTemp(t, true)
	c, _ := st.ClaimKey(keyA, fpA, time.Minute)
	if err := st.BeginStream(keyA, c.Token, 200, sseHeader, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, batch := range [][]StreamEvent{events(1, 3), events(4, 4), events(5, 20)} {
		if err := st.AppendEvents(keyA, c.Token, batch); err != nil {
			t.Fatal(err)
		}
	}
	if p, _ := st.ReadEvents(keyA, 0, 0); p.State != StreamLive || p.Events != 20 {
		t.Fatalf("live head: %+v", p)
	}
	if err := st.FinishStream(keyA, c.Token, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	again, _ := st.ClaimKey(keyA, fpA, time.Minute)
	if again.Outcome != Replay || !again.Record.Streamed || again.Record.Response.Status != 200 {
		t.Fatalf("after finish: outcome %v streamed %v", again.Outcome, again.Record.Streamed)
	}
	var got []StreamEvent
	for after := uint64(4); ; {
		p, err := st.ReadEvents(keyA, after, 7)
		if err != nil || p.State != StreamFinished {
			t.Fatalf("page after %d: %v %v", after, p.State, err)
		}
		if len(p.List) == 0 {
			break
		}
		got = append(got, p.List...)
		after = p.List[len(p.List)-1].Seq
	}
	if len(got) != 16 || got[0].Seq != 5 || got[0].ID != "5" || string(got[15].Data) != "id: 20\ndata: 20\n\n" {
		t.Fatalf("read %d events from 5: first %+v", len(got), got[0])
	}
}

func TestUpstreamEventIDsAreIndexed(t *testing.T) {
	st := openTemp(t, false)
	c, _ := st.ClaimKey(keyA, fpA, time.Minute)
	_ = st.BeginStream(keyA, c.Token, 200, sseHeader, time.Hour)
	_ = st.AppendEvents(keyA, c.Token, []StreamEvent{{ID: "chatcmpl-a", Data: []byte("x")}, {ID: "2", Data: []byte("y")}, {ID: "chatcmpl-c", Data: []byte("z")}})
	for id, want := range map[string]uint64{"chatcmpl-a": 1, "2": 2, "chatcmpl-c": 3} {
		if seq, ok, err := st.FindEvent(keyA, id); !ok || seq != want || err != nil {
			t.Errorf("FindEvent(%q) = %d %v %v, want %d", id, seq, ok, err, want)
		}
	}
	if _, ok, _ := st.FindEvent(keyA, "9"); ok {
		t.Error("found an event past the end")
	}
}

func TestAbortedStreamReleasesTheKeyAndIsNeverReplayed(t *testing.T) {
	st := openTemp(t, true)
	c, _ := st.ClaimKey(keyA, fpA, time.Minute)
	_ = st.BeginStream(keyA, c.Token, 200, sseHeader, time.Hour)
	_ = st.AppendEvents(keyA, c.Token, events(1, 10))
	if err := st.AbortStream(keyA, c.Token); err != nil {
		t.Fatal(err)
	}
	if p, _ := st.ReadEvents(keyA, 0, 100); p.State != StreamAborted || len(p.List) != 0 {
		t.Fatalf("after abort: %v with %d events", p.State, len(p.List))
	}
	if again, _ := st.ClaimKey(keyA, fpA, time.Minute); again.Outcome != Claimed {
		t.Fatalf("after abort the key is %v, want claimable", again.Outcome)
	}
	if err := st.FinishStream(keyA, c.Token, time.Now().Add(time.Hour)); !errors.Is(err, errStreamNotLive) {
		t.Fatalf("finishing an aborted stream: %v", err)
	}
}

func TestStreamOfACrashedGatewayReadsAsAborted(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	st, err := Open(Options{Dir: t.TempDir(), Now: func() time.Time { return time.Unix(0, now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, _ := st.ClaimKey(keyA, fpA, time.Minute)
	_ = st.BeginStream(keyA, c.Token, 200, sseHeader, time.Hour)
	_ = st.AppendEvents(keyA, c.Token, events(1, 10))
	now.Add(int64(2 * time.Minute)) // the holder never finished: its lease runs out
	if p, _ := st.ReadEvents(keyA, 0, 100); p.State != StreamAborted {
		t.Fatalf("a stream whose claim expired reads as %v", p.State)
	}
	next, _ := st.ClaimKey(keyA, fpA, time.Minute)
	if next.Outcome != Claimed {
		t.Fatalf("the crashed stream's key is %v, want claimable", next.Outcome)
	}
	if p, _ := st.ReadEvents(keyA, 0, 100); p.State == StreamLive || p.Token == next.Token {
		t.Fatalf("the new claim inherited the old stream: %+v", p)
	}
}

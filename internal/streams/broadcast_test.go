package streams

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

var eventStream = http.Header{"Content-Type": {"text/event-stream"}}

// relayed runs Relay of src from after into a recorder, returning what it wrote and whether it
// reported the stream broken off.
func relayed(t *testing.T, src Source, after uint64) (string, bool) {
	t.Helper()
	w := httptest.NewRecorder()
	done := make(chan bool, 1)
	go func() { done <- Relay(w, httptest.NewRequest("GET", "/", nil), src, after) }()
	select {
	case broken := <-done:
		return w.Body.String(), broken
	case <-time.After(10 * time.Second):
		t.Fatal("Relay has not returned in 10s")
		return "", false
	}
}

// TestBroadcastNumbersEventsAndResumesAfterAnID: an answer written in pieces is cut into
// events numbered from 1, a follower that names an event's id resumes after it, and a
// follower that joins before the end sees the rest as it comes, then the end.
func TestBroadcastNumbersEventsAndResumesAfterAnID(t *testing.T) {
	b := NewBroadcast(nil)
	if !b.Open(200, eventStream) {
		t.Fatal("an event-stream answer was not opened")
	}
	select {
	case <-b.Begun():
	default:
		t.Fatal("Begun is not closed once the stream opened")
	}
	b.Write([]byte("data: a\n\ndata: b\n\nda"))
	if n, _ := b.Progress(); n != 2 {
		t.Fatalf("%d events after two whole ones and a partial, want 2", n)
	}
	after, ok := b.Find("1")
	if !ok || after != 1 {
		t.Fatalf("Find(1): %d %v", after, ok)
	}
	out := make(chan string, 1)
	go func() { s, _ := relayed(t, b, after); out <- s }()
	b.Write([]byte("ta: c\n\n"))
	b.Finish(Whole)
	got := <-out
	if !strings.Contains(got, "data: b") || !strings.Contains(got, "data: c") || strings.Contains(got, "data: a") {
		t.Fatalf("a follower resuming after event 1 got %q", got)
	}
	if b.Open(200, http.Header{"Content-Type": {"application/json"}}) {
		t.Fatal("a JSON answer opened as a stream")
	}
}

// TestBroadcastBrokenOffIsReportedToFollowers: a stream that breaks off makes Relay report it.
func TestBroadcastBrokenOffIsReportedToFollowers(t *testing.T) {
	b := NewBroadcast(nil)
	b.Open(200, eventStream)
	b.Write([]byte("data: a\n\n"))
	b.Finish(BrokeOff)
	b.Finish(Whole) // once ended, the end stays
	if got, broken := relayed(t, b, 0); !broken || !strings.Contains(got, "data: a") {
		t.Fatalf("relay of a broken stream: %q, broken %v", got, broken)
	}
}

// copied keeps what a Broadcast copies.
type copied struct {
	status int
	events []store.StreamEvent
}

func (c *copied) Begin(status int, _ http.Header) { c.status = status }
func (c *copied) Add(events []store.StreamEvent)  { c.events = append(c.events, events...) }

// TestBroadcastCopiesItsEvents: the copier gets the head and every whole event, numbered.
func TestBroadcastCopiesItsEvents(t *testing.T) {
	c := &copied{}
	b := NewBroadcast(c)
	b.Open(201, eventStream)
	b.Write([]byte("data: a\n\ndata: b\n\n"))
	if c.status != 201 || len(c.events) != 2 || c.events[1].Seq != 2 || c.events[1].ID != "2" {
		t.Fatalf("copied %d and %+v", c.status, c.events)
	}
}

// TestLiveFollowerReadsRecordedAndPendingEventsToTheEnd: a follower of a recording reads the
// events the store has and those still pending, to a whole end; a recording given up on
// (StopRecording) ends its followers broken off and drains as not whole.
func TestLiveFollowerReadsRecordedAndPendingEventsToTheEnd(t *testing.T) {
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, tc := range []struct {
		name  string
		stop  bool
		whole bool
	}{{"whole", false, true}, {"given up", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			key := []byte(tc.name)
			c, err := st.ClaimKey(key, []byte("fp"), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			l := NewLive(st, key, store.KeyHolder(c.Token), 200, eventStream, time.Hour)
			go l.AppendEvents(nopLogger{})
			l.Add([]store.StreamEvent{{ID: "1", Data: []byte("id: 1\ndata: a\n\n")}, {ID: "2", Data: []byte("id: 2\ndata: b\n\n")}})
			if seq, ok := l.Find("2"); !ok || seq != 2 {
				t.Fatalf("Find(2): %d %v", seq, ok)
			}
			if tc.stop {
				l.StopRecording()
			}
			if got := l.Drain(); got != tc.whole {
				t.Fatalf("Drain: %v, want %v", got, tc.whole)
			}
			if tc.whole {
				l.Finish(Whole)
			}
			got, broken := relayed(t, l, 0)
			if broken == tc.whole {
				t.Fatalf("follower: broken %v, want %v", broken, !tc.whole)
			}
			if tc.whole && (!strings.Contains(got, "data: a") || !strings.Contains(got, "data: b")) {
				t.Fatalf("follower of a whole recording got %q", got)
			}
			if l.Joinable() {
				t.Fatal("an ended recording is joinable")
			}
		})
	}
}

type nopLogger struct{}

func (nopLogger) Warn(string, ...zap.Field) {}

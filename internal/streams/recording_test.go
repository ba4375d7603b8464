package streams

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// recordedClient is the client's side of a keyed run: what was relayed to it and how often it
// was flushed.
type recordedClient struct {
	w       *httptest.ResponseRecorder
	flushes int
}

func (c *recordedClient) Client() http.ResponseWriter { return c.w }
func (c *recordedClient) ToClient(p []byte)           { c.w.Write(p) }
func (c *recordedClient) FlushClient()                { c.flushes++ }

// keyedRun claims key in a fresh Badger store and returns the store, the claim's token and a
// Keyed that records every status, keeps maxBytes of a stream and says it replays until expires.
func keyedRun(t *testing.T, key []byte, maxBytes int64, expires time.Time) (*badger.Store, string, *Keyed) {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c, err := st.ClaimKey(key, []byte("fp"), time.Minute)
	if err != nil || c.Outcome != store.Claimed {
		t.Fatalf("claim: %+v %v", c, err)
	}
	k := &Keyed{Records: func(int) bool { return true }, Keep: time.Hour, MaxBytes: maxBytes,
		Expiry: func() time.Time { return expires }, Lives: NewLives(), Flights: NewFlights()}
	return st, c.Token, k
}

func eventStreamHead() http.Header {
	return http.Header{"Content-Type": {"text/event-stream"}, "Content-Length": {"40"}}
}

// A keyed run's event stream is relayed with an id on every event, flushed per upstream write,
// joinable live while it runs, and once ended recorded whole: it replays from the store until
// the expiry the block gave, and the process no longer lists it as live.
func TestKeyedStreamIsRelayedWithIDsAndRecordedWhole(t *testing.T) {
	key := []byte("rk")
	expires := time.Now().Add(time.Hour).Truncate(time.Second)
	st, token, k := keyedRun(t, key, 1<<20, expires)
	client := &recordedClient{w: httptest.NewRecorder()}
	client.w.Header().Set("Content-Length", "40")
	rec := k.Record(st, key, token, client, zap.NewNop())
	head := eventStreamHead()
	if !rec.Open(200, head) {
		t.Fatal("an event stream the block records was not opened")
	}
	if head.Get("Content-Length") != "" || client.w.Header().Get("Content-Length") != "" {
		t.Fatal("Content-Length kept on a stream whose events gain ids")
	}
	rec.Write([]byte("data: a\n\ndata: b"))
	rec.Write([]byte("\n\n"))
	if got := client.w.Body.String(); got != "id: 1\ndata: a\n\nid: 2\ndata: b\n\n" || client.flushes != 2 {
		t.Fatalf("relayed %q in %d flushes", got, client.flushes)
	}
	claim := store.Claim{Outcome: store.InProgress, Record: &store.Record{Token: token}}
	if j, ok := k.Join(st, key, claim, clockwork.NewRealClock()); !ok || j.Source != k.Lives.Get(key) || j.Status != 200 || !j.Expires.IsZero() {
		t.Fatalf("a duplicate while it runs joins %+v, %v; want the live stream", j, ok)
	}
	got, err := rec.End(nil)
	if err != nil || !got.Equal(expires) {
		t.Fatalf("End: %v %v, want %v", got, err, expires)
	}
	if k.Lives.Get(key) != nil {
		t.Fatal("a finished stream is still listed as live")
	}
	page, err := st.ReadEvents(key, 0, 10)
	if err != nil || page.State != store.StreamFinished || page.Events != 2 || len(page.List) != 2 || page.List[1].ID != "2" {
		t.Fatalf("recorded: %+v %v", page, err)
	}
	again, err := st.ClaimKey(key, []byte("fp"), time.Minute)
	if err != nil || again.Outcome != store.Replay {
		t.Fatalf("a retry's claim: %+v %v, want a replay", again, err)
	}
	if j, ok := k.Join(st, key, again, clockwork.NewRealClock()); !ok || j.Status != 200 || !j.Expires.Equal(expires) {
		t.Fatalf("a retry joins %+v, %v; want the finished stream until its expiry", j, ok)
	}
	if !rec.Abandon() {
		t.Fatal("Abandon of a stream that ran says it was none")
	}
}

// A stream longer than max_result is relayed whole but not recorded: its end aborts the record
// and releases the key at once, so a retry runs afresh; a broken upstream aborts it too.
func TestKeyedStreamOverMaxBytesOrBrokenOffReleasesItsKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		err  error
	}{
		{"over max_result", "data: " + strings.Repeat("x", 64) + "\n\n", nil},
		{"broken off", "data: a\n\n", errors.New("upstream went away")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := []byte("rk")
			st, token, k := keyedRun(t, key, 32, time.Now().Add(time.Hour))
			client := &recordedClient{w: httptest.NewRecorder()}
			rec := k.Record(st, key, token, client, zap.NewNop())
			if !rec.Open(200, eventStreamHead()) {
				t.Fatal("not opened")
			}
			rec.Write([]byte(tc.body))
			if !strings.Contains(client.w.Body.String(), strings.TrimSuffix(tc.body, "\n\n")) {
				t.Fatalf("relayed %q", client.w.Body.String())
			}
			expires, err := rec.End(tc.err)
			if !expires.IsZero() || !errors.Is(err, tc.err) {
				t.Fatalf("End: %v %v, want no expiry and %v", expires, err, tc.err)
			}
			if k.Lives.Get(key) != nil {
				t.Fatal("an aborted stream is still listed as live")
			}
			if c, err := st.ClaimKey(key, []byte("fp"), time.Minute); err != nil || c.Outcome != store.Claimed {
				t.Fatalf("a retry's claim: %+v %v, want the key free", c, err)
			}
		})
	}
}

// An answer the block does not record, or one that is not an event stream, is left to the tee.
func TestKeyedRecordingLeavesWhatItDoesNotRecord(t *testing.T) {
	key := []byte("rk")
	st, token, k := keyedRun(t, key, 1<<20, time.Now())
	client := &recordedClient{w: httptest.NewRecorder()}
	if k.Record(st, key, token, client, zap.NewNop()).Open(200, http.Header{"Content-Type": {"application/json"}}) {
		t.Fatal("a JSON answer was taken as a stream")
	}
	k.Records = func(status int) bool { return status < 500 }
	rec := k.Record(st, key, token, client, zap.NewNop())
	if rec.Open(503, eventStreamHead()) || rec.Abandon() {
		t.Fatal("an event stream of a status the block does not record was taken")
	}
}

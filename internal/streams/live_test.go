package streams

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// appenders counts the goroutines running a Live's appender.
func appenders() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Count(buf, []byte("streams.(*Live).appendEvents"))
}

// waitCommitted waits until every event added to l is in the store, and its appender stopped.
func waitCommitted(t *testing.T, l *Live) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l.mu.Lock()
		done := l.committed == l.total && !l.appending
		ch := l.changes.ch
		l.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-time.After(time.Until(deadline)):
			t.Fatal("the appender has not written the events")
		}
	}
}

// TestIdleLiveStreamHoldsNoAppenderNorItsEvents: a live stream whose upstream is quiet, every
// event it sent already stored, holds no goroutine of its own and none of those events in
// memory (docs/streams.md); its next event starts the appender again, and a follower
// still reads every event to the end.
func TestIdleLiveStreamHoldsNoAppenderNorItsEvents(t *testing.T) {
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const n = 50
	before := appenders()
	lives := make([]*Live, n)
	for i := range lives {
		key := fmt.Appendf(nil, "idle-%d", i)
		c, err := st.ClaimKey(key, []byte("fp"), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		lives[i] = NewLive(st, key, store.KeyHolder(c.Token), 200, eventStream, time.Hour)
		lives[i].Begin(nopLogger{})
		lives[i].Add([]store.StreamEvent{{ID: "1", Data: []byte("id: 1\ndata: first\n\n")}})
	}
	for _, l := range lives {
		waitCommitted(t, l)
	}
	// An appender that stopped may still be returning: wait for the goroutines to go.
	for deadline := time.Now().Add(30 * time.Second); appenders() > before; {
		if time.Now().After(deadline) {
			t.Fatalf("%d appender goroutines for %d idle streams, want none", appenders()-before, n)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	for i, l := range lives {
		l.mu.Lock()
		held, bytes := cap(l.pending), l.pendingBytes
		l.mu.Unlock()
		if held != 0 || bytes != 0 {
			t.Fatalf("idle stream %d holds room for %d events (%d bytes) already stored", i, held, bytes)
		}
	}
	l := lives[0]
	l.Add([]store.StreamEvent{{ID: "2", Data: []byte("id: 2\ndata: second\n\n")}})
	if !l.Drain() {
		t.Fatal("the stream resumed after being idle was not recorded whole")
	}
	l.Finish(Whole)
	got, broken := relayed(t, l, 0)
	if broken || !strings.Contains(got, "data: first") || !strings.Contains(got, "data: second") {
		t.Fatalf("follower: broken %v, got %q", broken, got)
	}
	if page, err := st.ReadEvents(l.ID(), 0, 10); err != nil || len(page.List) != 2 {
		t.Fatalf("stored: %d events, %v", len(page.List), err)
	}
}

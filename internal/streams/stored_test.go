package streams

import (
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// A follower of a stream another process relays polls the store: at PollInterval while events
// come, backing off while the stream is quiet, up to MaxPollInterval (docs/streams.md), so
// followers of a stalled stream do not each read the store 20 times a second.
func TestStoredFollowerBacksOffWhileTheStreamIsQuiet(t *testing.T) {
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key := []byte("k")
	c, err := st.ClaimKey(key, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.BeginStream(key, store.KeyHolder(c.Token), 200, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	f := NewStored(st, key, c.Token, nil)
	var waits []time.Duration
	for range 6 {
		if evs, _, ready, err := f.Next(0); err != nil || len(evs) != 0 || ready == nil {
			t.Fatalf("a quiet live stream: %d events, ready %v, %v", len(evs), ready != nil, err)
		}
		waits = append(waits, f.Wait())
	}
	want := []time.Duration{PollInterval, 2 * PollInterval, 4 * PollInterval, 8 * PollInterval, MaxPollInterval, MaxPollInterval}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits between polls of a quiet stream: %v, want %v", waits, want)
		}
	}
	if err := st.AppendEvents(key, store.KeyHolder(c.Token), []store.StreamEvent{{ID: "1", Data: []byte("data: a\n\n")}}); err != nil {
		t.Fatal(err)
	}
	if evs, _, _, _ := f.Next(0); len(evs) != 1 {
		t.Fatalf("after an event the follower read %d", len(evs))
	}
	if _, _, _, _ = f.Next(1); f.Wait() != PollInterval {
		t.Fatalf("after an event the follower waits %v, want %v again", f.Wait(), PollInterval)
	}
}

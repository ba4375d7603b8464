package badger

import (
	"bytes"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

func openTemp(t *testing.T, sync bool) *Store {
	t.Helper()
	st, err := Open(Options{Dir: t.TempDir(), Sync: sync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

var (
	keyA = bytes.Repeat([]byte{1}, 32)
	fpA  = bytes.Repeat([]byte{2}, 32)
	fpB  = bytes.Repeat([]byte{3}, 32)
)

func TestClaimIsExclusiveUnderConcurrency(t *testing.T) {
	st := openTemp(t, true)
	var wg sync.WaitGroup
	outcomes := make(chan store.ClaimOutcome, 100)
	for range 100 {
		wg.Go(func() {
			c, err := st.ClaimKey(keyA, fpA, time.Minute)
			if err != nil {
				t.Error(err)
			}
			outcomes <- c.Outcome
		})
	}
	wg.Wait()
	close(outcomes)
	counts := map[store.ClaimOutcome]int{}
	for o := range outcomes {
		counts[o]++
	}
	if counts[store.Claimed] != 1 || counts[store.InProgress] != 99 {
		t.Fatalf("want 1 claimed and 99 in progress, got %v", counts)
	}
}

func TestCompletedKeyReplaysAndMismatchIsDetected(t *testing.T) {
	st := openTemp(t, false)
	c, err := st.ClaimKey(keyA, fpA, time.Minute)
	if err != nil || c.Outcome != store.Claimed {
		t.Fatalf("claim: %v %v", c.Outcome, err)
	}
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)}
	expires := time.Now().Add(time.Hour).Truncate(time.Second)
	if err := st.CompleteKey(keyA, c.Token, resp, expires); err != nil {
		t.Fatal(err)
	}
	again, err := st.ClaimKey(keyA, fpA, time.Minute)
	if err != nil || again.Outcome != store.Replay {
		t.Fatalf("want replay, got %v %v", again.Outcome, err)
	}
	got := again.Record.Response
	if got.Status != 201 || !bytes.Equal(got.Body, resp.Body) || got.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("replayed %+v", got)
	}
	if !again.Record.ExpiresAt.Equal(expires) {
		t.Fatalf("expires %v, want %v", again.Record.ExpiresAt, expires)
	}
	other, _ := st.ClaimKey(keyA, fpB, time.Minute)
	if other.Outcome != store.Mismatch {
		t.Fatalf("want mismatch, got %v", other.Outcome)
	}
}

func TestReleasedKeyRunsAgain(t *testing.T) {
	st := openTemp(t, true)
	c, _ := st.ClaimKey(keyA, fpA, time.Minute)
	if err := st.ReleaseKey(keyA, c.Token); err != nil {
		t.Fatal(err)
	}
	again, _ := st.ClaimKey(keyA, fpA, time.Minute)
	if again.Outcome != store.Claimed {
		t.Fatalf("want claimed after release, got %v", again.Outcome)
	}
}

func TestExpiredLeaseIsTakenOverAndOldHolderIsRefused(t *testing.T) {
	now := time.Now()
	st, err := Open(Options{Dir: t.TempDir(), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	first, _ := st.ClaimKey(keyA, fpA, time.Minute)
	if c, _ := st.ClaimKey(keyA, fpA, time.Minute); c.Outcome != store.InProgress {
		t.Fatalf("within the lease: %v", c.Outcome)
	}
	now = now.Add(2 * time.Minute)
	second, _ := st.ClaimKey(keyA, fpA, time.Minute)
	if second.Outcome != store.Claimed {
		t.Fatalf("after the lease: %v", second.Outcome)
	}
	err = st.CompleteKey(keyA, first.Token, store.Response{Status: 200}, now.Add(time.Hour))
	if !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("the stale holder completed: %v", err)
	}
}

func TestRecordsSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(Options{Dir: dir, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := st.ClaimKey(keyA, fpA, time.Minute)
	if err := st.CompleteKey(keyA, c.Token, store.Response{Status: 200, Body: []byte("hi")}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st, err = Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.LookupKey(keyA)
	if err != nil || rec == nil || string(rec.Response.Body) != "hi" {
		t.Fatalf("after reopen: %+v %v", rec, err)
	}
}

func TestOneDatabaseIsSharedPerDirectory(t *testing.T) {
	dir := t.TempDir()
	a, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("second handle on the same directory: %v", err)
	}
	c, _ := a.ClaimKey(keyA, fpA, time.Minute)
	a.Close()
	if err := b.ReleaseKey(keyA, c.Token); err != nil {
		t.Fatalf("the database closed with a handle still open: %v", err)
	}
	b.Close()
	if _, err := b.LookupKey(keyA); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a closed handle answered: %v", err)
	}
	again, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("reopen after the last handle closed: %v", err)
	}
	again.Close()
}

func TestEvictKey(t *testing.T) {
	st := openTemp(t, false)
	st.ClaimKey(keyA, fpA, time.Minute)
	found, err := st.EvictKey(keyA)
	if err != nil || !found {
		t.Fatalf("evict: %v %v", found, err)
	}
	if c, _ := st.ClaimKey(keyA, fpB, time.Minute); c.Outcome != store.Claimed {
		t.Fatalf("after evict: %v", c.Outcome)
	}
}

func TestSizeCountsTheFilesOnDisk(t *testing.T) {
	s := openTemp(t, true)
	claim, err := s.ClaimKey([]byte("size"), []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteKey([]byte("size"), claim.Token, store.Response{Status: 200, Body: make([]byte, 4096)}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := s.Size(); n <= 0 {
		t.Fatalf("Size() = %d after a durable write, want the bytes of the database's files", n)
	}
}

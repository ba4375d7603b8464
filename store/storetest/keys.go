package storetest

import (
	"bytes"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

var (
	keyA = bytes.Repeat([]byte{1}, 32)
	fpA  = bytes.Repeat([]byte{2}, 32)
	fpB  = bytes.Repeat([]byte{3}, 32)
)

var keyTests = []test{
	{"ClaimIsExclusiveUnderConcurrency", testClaimIsExclusiveUnderConcurrency},
	{"CompletedKeyReplaysTheRecordedResponse", testCompletedKeyReplaysTheRecordedResponse},
	{"DifferentFingerprintIsAMismatch", testDifferentFingerprintIsAMismatch},
	{"ReleasedKeyRunsAgain", testReleasedKeyRunsAgain},
	{"ExpiredClaimIsTakenOverAndTheLateHolderChangesNothing", testExpiredClaimIsTakenOver},
	{"EvictedKeyRunsAgain", testEvictedKeyRunsAgain},
	{"KeyRunsAgainAfterItsReplayWindow", testKeyRunsAgainAfterItsReplayWindow},
	{"PingAnswersUntilClosed", testPing},
}

// Of many concurrent claims of one key, through two handles, exactly one wins.
func testClaimIsExclusiveUnderConcurrency(t *testing.T, e *env) {
	handles := []store.Backend{e.open(), e.open()}
	var wg sync.WaitGroup
	outcomes := make(chan store.ClaimOutcome, 40)
	for i := range 40 {
		wg.Go(func() {
			c, err := handles[i%2].ClaimKey(keyA, fpA, time.Minute)
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
	if counts[store.Claimed] != 1 || counts[store.InProgress] != 39 {
		t.Fatalf("want 1 claimed and 39 in progress, got %v", counts)
	}
}

func testCompletedKeyReplaysTheRecordedResponse(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	c := must(a.ClaimKey(keyA, fpA, time.Minute))(t)
	if c.Outcome != store.Claimed || c.Token == "" {
		t.Fatalf("claim: %+v", c)
	}
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"1", "2"}}, Body: []byte(`{"ok":true}`)}
	expires := e.clock.Now().Add(time.Hour)
	if err := a.CompleteKey(keyA, c.Token, resp, expires); err != nil {
		t.Fatal(err)
	}
	r := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if r.Outcome != store.Replay || r.Record == nil || r.Record.Response == nil {
		t.Fatalf("replay through another handle: %+v", r)
	}
	got := r.Record.Response
	if got.Status != 201 || string(got.Body) != `{"ok":true}` || got.Header.Get("Content-Type") != "application/json" || len(got.Header["X-Multi"]) != 2 {
		t.Fatalf("replayed %d %q %v", got.Status, got.Body, got.Header)
	}
	if !r.Record.ExpiresAt.Equal(expires) {
		t.Fatalf("expires %v, want %v", r.Record.ExpiresAt, expires)
	}
	rec := must(b.LookupKey(keyA))(t)
	if rec == nil || rec.State != store.Completed || string(rec.Response.Body) != `{"ok":true}` {
		t.Fatalf("lookup: %+v", rec)
	}
}

func testDifferentFingerprintIsAMismatch(t *testing.T, e *env) {
	b := e.open()
	c := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if got := must(b.ClaimKey(keyA, fpB, time.Minute))(t); got.Outcome != store.Mismatch {
		t.Fatalf("in flight, other body: %v", got.Outcome)
	}
	if err := b.CompleteKey(keyA, c.Token, store.Response{Status: 200}, e.clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := must(b.ClaimKey(keyA, fpB, time.Minute))(t); got.Outcome != store.Mismatch {
		t.Fatalf("completed, other body: %v", got.Outcome)
	}
	// A claim whose lease ran out is not taken over by another body either.
	k2 := bytes.Repeat([]byte{9}, 32)
	must(b.ClaimKey(k2, fpA, time.Minute))(t)
	e.clock.Advance(61 * time.Second)
	if got := must(b.ClaimKey(k2, fpB, time.Minute))(t); got.Outcome != store.Mismatch {
		t.Fatalf("expired claim, other body: %v", got.Outcome)
	}
}

func testReleasedKeyRunsAgain(t *testing.T, e *env) {
	b := e.open()
	c := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if err := b.ReleaseKey(keyA, "not-the-token"); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("release with another token: %v, want ErrNotHolder", err)
	}
	if err := b.ReleaseKey(keyA, c.Token); err != nil {
		t.Fatal(err)
	}
	if rec := must(b.LookupKey(keyA))(t); rec != nil {
		t.Fatalf("released key still has %+v", rec)
	}
	if got := must(b.ClaimKey(keyA, fpB, time.Minute))(t); got.Outcome != store.Claimed {
		t.Fatalf("after release: %v", got.Outcome)
	}
}

// A holder that outlived its lease loses the key; when it comes back late it gets ErrNotHolder
// and neither completes nor releases the new holder's claim.
func testExpiredClaimIsTakenOver(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	first := must(a.ClaimKey(keyA, fpA, time.Minute))(t)
	e.clock.Advance(30 * time.Second)
	if got := must(b.ClaimKey(keyA, fpA, time.Minute))(t); got.Outcome != store.InProgress {
		t.Fatalf("within the lease: %v", got.Outcome)
	}
	e.clock.Advance(31 * time.Second)
	second := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	if second.Outcome != store.Claimed || second.Token == first.Token {
		t.Fatalf("after the lease: %+v", second)
	}
	if err := a.CompleteKey(keyA, first.Token, store.Response{Status: 500}, e.clock.Now().Add(time.Hour)); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("late complete: %v, want ErrNotHolder", err)
	}
	if err := a.ReleaseKey(keyA, first.Token); !errors.Is(err, store.ErrNotHolder) {
		t.Fatalf("late release: %v, want ErrNotHolder", err)
	}
	rec := must(a.LookupKey(keyA))(t)
	if rec == nil || rec.State != store.InFlight || rec.Token != second.Token {
		t.Fatalf("the new holder's claim was touched: %+v", rec)
	}
	if err := b.CompleteKey(keyA, second.Token, store.Response{Status: 200}, e.clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
}

func testEvictedKeyRunsAgain(t *testing.T, e *env) {
	b := e.open()
	c := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	ok(t, b.CompleteKey(keyA, c.Token, store.Response{Status: 200}, e.clock.Now().Add(time.Hour)))
	if found := must(b.EvictKey(keyA))(t); !found {
		t.Fatal("evict found nothing")
	}
	if found := must(b.EvictKey(keyA))(t); found {
		t.Fatal("evicted twice")
	}
	if got := must(b.ClaimKey(keyA, fpB, time.Minute))(t); got.Outcome != store.Claimed {
		t.Fatalf("after evict: %v", got.Outcome)
	}
}

func testKeyRunsAgainAfterItsReplayWindow(t *testing.T, e *env) {
	b := e.open()
	c := must(b.ClaimKey(keyA, fpA, time.Minute))(t)
	ok(t, b.CompleteKey(keyA, c.Token, store.Response{Status: 200}, e.clock.Now().Add(time.Hour)))
	e.clock.Advance(59 * time.Minute)
	if got := must(b.ClaimKey(keyA, fpA, time.Minute))(t); got.Outcome != store.Replay {
		t.Fatalf("inside the window: %v", got.Outcome)
	}
	e.clock.Advance(2 * time.Minute)
	if rec := must(b.LookupKey(keyA))(t); rec != nil {
		t.Fatalf("past the window the record is still read: %+v", rec)
	}
	if got := must(b.ClaimKey(keyA, fpB, time.Minute))(t); got.Outcome != store.Claimed {
		t.Fatalf("past the window: %v", got.Outcome)
	}
}

func testPing(t *testing.T, e *env) {
	b := e.open()
	if err := b.Ping(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Ping(); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("ping after close: %v, want ErrUnavailable", err)
	}
}

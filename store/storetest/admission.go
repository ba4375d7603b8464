package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// admissionTests hold AcceptOperation's ScopeLimit (async max_per_scope, docs/caddyfile.md).
var admissionTests = []test{
	{"ScopeLimitHoldsUnderConcurrentAcceptsThroughTwoHandles", testScopeLimitHoldsAcrossHandles},
}

// Of many concurrent accepts for one scope through two handles (two replicas on PostgreSQL),
// exactly ScopeLimit are stored and the rest refused with ErrScopeFull; another scope is not
// counted, and a keyed accept whose key already answers is answered, not refused.
func testScopeLimitHoldsAcrossHandles(t *testing.T, e *env) {
	const limit, tries = 5, 40
	handles := []store.Backend{e.open(), e.open()}
	keyed := e.newOp(999, "s")
	must(handles[0].AcceptOperation(keyed, &store.Request{Method: "POST", URL: "/v1/x"},
		&store.KeyAccept{Key: keyA, Fingerprint: fpA, Response: store.Response{Status: 202}, Expires: e.clock.Now().Add(time.Hour)}))(t)
	var wg sync.WaitGroup
	for range 16 { // every connection of each handle's pool open before the race begins
		for _, h := range handles {
			wg.Go(func() { _, _ = h.ActiveCount("warm") })
		}
	}
	wg.Wait()
	var mu sync.Mutex
	accepted, refused := 0, 0
	start := make(chan struct{})
	for i := range tries {
		wg.Go(func() {
			<-start
			op := e.newOp(i, "s")
			op.ScopeLimit = limit
			_, err := handles[i%2].AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				accepted++
			case errors.Is(err, store.ErrScopeFull):
				refused++
			default:
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	if accepted != limit-1 || refused != tries-limit+1 {
		t.Fatalf("with 1 operation stored and a limit of %d: %d accepted, %d refused", limit, accepted, refused)
	}
	if n := must(handles[1].ActiveCount("s"))(t); n != limit {
		t.Fatalf("the scope holds %d active operations, limit %d", n, limit)
	}
	other := e.newOp(1000, "t")
	other.ScopeLimit = 1
	must(handles[1].AcceptOperation(other, &store.Request{}, nil))(t)
	again := e.newOp(1001, "s")
	again.ScopeLimit = limit
	c, err := handles[1].AcceptOperation(again, &store.Request{}, &store.KeyAccept{Key: keyA, Fingerprint: fpA, Expires: e.clock.Now().Add(time.Hour)})
	if err != nil || c.Outcome != store.Replay {
		t.Fatalf("a keyed accept whose key answers, in a full scope: %v %v", c.Outcome, err)
	}
}

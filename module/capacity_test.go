package module

import (
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// arrivals records the order in which keyed calls reach the model server.
type arrivals struct {
	mu   sync.Mutex
	keys []string
}

func (a *arrivals) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k := r.Header.Get("Idempotency-Key"); k != "" {
			a.mu.Lock()
			a.keys = append(a.keys, k)
			a.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

func (a *arrivals) order() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.keys)
}

// startSlotted starts the gateway before a model server with slots and a first-come queue.
func startSlotted(t *testing.T, slots int, latency time.Duration, mulligan string) (*gateway, *arrivals) {
	t.Helper()
	a := &arrivals{}
	g := startGatewayWith(t, gatewaySetup{model: modelserver.Config{Slots: slots, Latency: latency},
		globals: "log {\n level ERROR\n }", mulligan: mulligan, wrap: a.wrap})
	return g, a
}

func TestCapacitySeatsBoundTheUpstreamForSyncCallsAndOperationsTogether(t *testing.T) {
	g, _ := startSlotted(t, 2, 100*time.Millisecond, "async {\n concurrency 8\n}\ncapacity {\n limit 2\n}")
	var wg sync.WaitGroup
	ops := make(chan string, 6)
	for i := range 6 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if r := g.post(chatPath, "", chat("sync")); r.err != nil || r.StatusCode != 200 {
				t.Errorf("sync call %d: %v %s", i, r.err, r.body)
			}
		}()
		go func() {
			defer wg.Done()
			_, op := g.submit(t, "")
			ops <- op.OperationID
		}()
	}
	wg.Wait()
	close(ops)
	for id := range ops {
		if op := g.await(t, id); op.Status != "succeeded" {
			t.Errorf("operation %s: %s", id, op.Status)
		}
	}
	st := g.model.Stats()
	if st.Completed != 12 || st.MaxInFlight > 2 || st.MaxQueued != 0 {
		t.Fatalf("model server: completed %d, at most %d in flight and %d queued; want 12, 2, 0", st.Completed, st.MaxInFlight, st.MaxQueued)
	}
}

func TestCapacityUrgentOperationOvertakesTenLowUrgencyOnes(t *testing.T) {
	g, a := startSlotted(t, 1, 100*time.Millisecond, "capacity {\n limit 1\n}")
	var ids []string
	for i := range 10 {
		_, op := g.submit(t, "low-"+itoa(i), "Priority", "u=6")
		ids = append(ids, op.OperationID)
	}
	_, op := g.submit(t, "urgent", "Priority", "u=0, i")
	ids = append(ids, op.OperationID)
	if view := decodeOp(t, g.get("/v1/operations/"+op.OperationID)); view.Urgency != 0 {
		t.Fatalf("the urgent operation shows urgency %d", view.Urgency)
	}
	for _, id := range ids {
		g.await(t, id)
	}
	order := a.order()
	if at := slices.Index(order, "urgent"); at < 0 || at > 2 {
		t.Fatalf("the urgent operation reached the model server at position %d of %v; want among the first three", at, order)
	}
}

func TestCapacityTenantsTakeTurns(t *testing.T) {
	g, a := startSlotted(t, 1, 50*time.Millisecond, "capacity {\n limit 1\n}")
	var ids []string
	for i := range 20 {
		_, op := g.submit(t, "a-"+itoa(i), "Authorization", "Bearer tenant-a")
		ids = append(ids, op.OperationID)
	}
	var bs []string
	for i := range 2 {
		_, op := g.submit(t, "b-"+itoa(i), "Authorization", "Bearer tenant-b")
		bs = append(bs, op.OperationID)
	}
	for _, id := range ids {
		g.await(t, id, "Authorization", "Bearer tenant-a")
	}
	for _, id := range bs {
		g.await(t, id, "Authorization", "Bearer tenant-b")
	}
	order := a.order()
	for _, k := range []string{"b-0", "b-1"} {
		if at := slices.Index(order, k); at < 0 || at > 7 {
			t.Errorf("%s reached the model server at position %d of %v; want within a few turns (by 8)", k, at, order)
		}
	}
}

func TestCapacityStaleOperationFailsQueueTimeoutWithoutReachingTheUpstream(t *testing.T) {
	g, a := startSlotted(t, 1, 0, "capacity {\n limit 1\n max_queue_wait 1h\n}")
	_, long := g.submit(t, "long", "X-Mock-Latency", "1500ms")
	waitFor(t, func() bool { return g.model.Stats().InFlight == 1 })
	began := time.Now()
	_, stale := g.submit(t, "stale", "Max-Queue-Wait", "1")
	got := g.await(t, stale.OperationID)
	if got.Status != "failed" || got.Error == nil || got.Error.Code != string(CodeQueueTimeout) || !got.Error.Retryable {
		t.Fatalf("stale operation: %+v %+v", got, got.Error)
	}
	if waited := time.Since(began); waited > 1400*time.Millisecond {
		t.Errorf("the stale operation failed after %v; its deadline was 1s", waited)
	}
	if done := g.await(t, long.OperationID); done.Status != "succeeded" {
		t.Fatalf("the long operation: %s", done.Status)
	}
	if order := a.order(); slices.Contains(order, "stale") {
		t.Fatalf("the stale operation reached the model server: %v", order)
	}
}

// holdSeat starts a slow sync call and returns once the model server runs it.
func holdSeat(t *testing.T, g *gateway) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if r := g.post(chatPath, "", chat("slow"), "X-Mock-Latency", "1500ms"); r.err != nil || r.StatusCode != 200 {
			t.Errorf("the seat holder: %v %s", r.err, r.body)
		}
	}()
	waitFor(t, func() bool { return g.model.Stats().InFlight == 1 })
	return &wg
}

func TestCapacitySaturatedSyncCallGets503WithRetryAfterAfterItsWait(t *testing.T) {
	g, _ := startSlotted(t, 1, 0, "capacity {\n limit 1\n wait 300ms\n}")
	holder := holdSeat(t, g)
	began := time.Now()
	r := g.post(chatPath, "k-saturated", chat("refused"))
	waited := time.Since(began)
	expectError(t, r, http.StatusServiceUnavailable, CodeUpstreamSaturated, true)
	if waited < 300*time.Millisecond || waited > 1200*time.Millisecond {
		t.Errorf("answered after %v; want about the 300ms wait", waited)
	}
	holder.Wait()
	if st := g.model.Stats(); st.Received != 1 {
		t.Fatalf("the model server received %d calls; the refused one must never reach it", st.Received)
	}
	// The refusal was not recorded: the key runs once a seat is free.
	if r := g.post(chatPath, "k-saturated", chat("refused")); r.StatusCode != 200 {
		t.Fatalf("retry after the refusal: %d %s", r.StatusCode, r.body)
	}
}

func TestCapacitySaturatedCallThatMayBecomeAsyncIsQueued(t *testing.T) {
	g, _ := startSlotted(t, 1, 0, "async {\n mode after 2s\n}\ncapacity {\n limit 1\n wait 300ms\n}")
	holder := holdSeat(t, g)
	began := time.Now()
	r := g.post(chatPath, "", chat("queued"))
	if r.err != nil || r.StatusCode != http.StatusAccepted || time.Since(began) < 300*time.Millisecond {
		t.Fatalf("got %v %s after %v; want 202 after the 300ms wait", r.err, r.body, time.Since(began))
	}
	op := decodeOp(t, r)
	holder.Wait()
	if done := g.await(t, op.OperationID); done.Status != "succeeded" {
		t.Fatalf("the queued call: %s", done.Status)
	}
	if st := g.model.Stats(); st.MaxInFlight != 1 {
		t.Fatalf("the model server had %d calls at once; the limit is 1", st.MaxInFlight)
	}
}

func TestUrgencyOfPriorityHeader(t *testing.T) {
	for _, c := range []struct {
		values []string
		want   int
	}{
		{nil, 3},
		{[]string{"u=0"}, 0},
		{[]string{"u=7, i"}, 7},
		{[]string{"i, u=1;x=2"}, 1},       // parameters ignored
		{[]string{"u=5, foo=\"bar\""}, 5}, // unknown members ignored
		{[]string{"u=2", "u=6"}, 6},       // lines join; the last u counts
		{[]string{"u=8"}, 3},              // out of range
		{[]string{"u=-1"}, 3},
		{[]string{"u=1.5"}, 3}, // not an integer
		{[]string{"u=\"1\""}, 3},
		{[]string{"u=1,"}, 3}, // not a dictionary: the whole header is ignored
		{[]string{"U=1"}, 3},
		{[]string{"u=1 x"}, 3},
		{[]string{"x=(a b), u=2"}, 2}, // an inner list
		{[]string{"x=(a b, u=2"}, 3},
	} {
		if got := urgencyOf(c.values); got != c.want {
			t.Errorf("Priority %q: urgency %d, want %d", c.values, got, c.want)
		}
	}
}

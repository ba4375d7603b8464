package module

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/idemkey"
	"github.com/mulligan-gw/mulligan/internal/testkit"
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
	g := startHandlerWith(t, gatewaySetup{model: modelserver.Config{Slots: slots, Latency: latency},
		globals: quietGlobals, mulligan: mulligan, wrap: a.wrap})
	return g, a
}

func TestCapacitySeatsBoundTheUpstreamForSyncCallsAndOperationsTogether(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
	g, a := startSlotted(t, 1, 50*time.Millisecond, "capacity {\n limit 1\n}")
	// The first holds the only seat long enough for the rest to be submitted behind it; the
	// next is claimed at once and waits for the seat as the queue's head.
	_, first := g.submit(t, "low-0", "Priority", "u=6", "X-Mock-Latency", "1s")
	ids := []string{first.OperationID}
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	for i := 1; i < 10; i++ {
		_, op := g.submit(t, "low-"+itoa(i), "Priority", "u=6")
		ids = append(ids, op.OperationID)
	}
	_, op := g.submit(t, "urgent", "Priority", "u=0, i")
	ids = append(ids, op.OperationID)
	// A caller's u=0 is trusted to order its own work only: it waits at the default across
	// tenants, still ahead of the u=6 work (docs/capacity.md, "Fairness").
	if view := decodeOp(t, g.get("/v1/operations/"+op.OperationID)); view.Urgency != 3 {
		t.Fatalf("the urgent operation shows urgency %d; want 3", view.Urgency)
	}
	// The last low one waits behind the urgent one and the others: its position says so.
	if view := decodeOp(t, g.get("/v1/operations/"+ids[9])); view.Status != "queued" || view.QueuePosition == nil || *view.QueuePosition < 1 || view.Urgency != 6 {
		t.Fatalf("the last low-urgency operation: %s, urgency %d, queue_position %v", view.Status, view.Urgency, view.QueuePosition)
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
	t.Parallel()
	g, a := startSlotted(t, 1, 50*time.Millisecond, "capacity {\n limit 1\n}")
	// Tenant A's first call holds the only seat while the rest of the work is submitted.
	_, first := g.submit(t, "a-0", "Authorization", "Bearer tenant-a", "X-Mock-Latency", "2s")
	ids := []string{first.OperationID}
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	for i := 1; i < 20; i++ {
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
		// a-0 held the seat and a-1 was claimed to wait for it; then the tenants take turns.
		if at := slices.Index(order, k); at < 0 || at > 5 {
			t.Errorf("%s reached the model server at position %d of %v; want within a few turns (by 6)", k, at, order)
		}
	}
}

func TestCapacityStaleOperationFailsQueueTimeoutWithoutReachingTheUpstream(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, secretA, nil)
	g, a := startSlotted(t, 1, 0, "capacity {\n limit 1\n max_queue_wait 1h\n}\n"+webhooksBlock(rc.srv.URL+"/hook", "events operation.failed", secretA))
	_, long := g.submit(t, "long", "X-Mock-Latency", "3s")
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	// The head of the queue waits for the seat in memory; the stale ones behind it in storage.
	began := time.Now()
	_, head := g.submit(t, "head", "Max-Queue-Wait", "1")
	_, stale := g.submit(t, "stale", "Max-Queue-Wait", "1")
	for _, id := range []string{head.OperationID, stale.OperationID} {
		got := g.await(t, id)
		if got.Status != "failed" || got.Error == nil || got.Error.Code != string(apierr.CodeQueueTimeout) || !got.Error.Retryable {
			t.Fatalf("stale operation: %+v %+v", got, got.Error)
		}
	}
	if waited := time.Since(began); waited > 2500*time.Millisecond {
		t.Errorf("the stale operations failed after %v; their deadline was 1s, the sweep runs every second", waited)
	}
	if done := g.await(t, long.OperationID); done.Status != "succeeded" {
		t.Fatalf("the long operation: %s", done.Status)
	}
	if order := a.order(); slices.Contains(order, "stale") || slices.Contains(order, "head") {
		t.Fatalf("the stale operation reached the model server: %v", order)
	}
	// Its failure is announced like any other.
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 2", func() bool { return rc.delivered() == 2 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, ev := range rc.events {
		operation, _ := ev["operation"].(map[string]any)
		failure, _ := operation["error"].(map[string]any)
		if ev["event_type"] != "operation.failed" || failure["code"] != string(apierr.CodeQueueTimeout) {
			t.Fatalf("event: %v", ev)
		}
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
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	return &wg
}

func TestCapacitySaturatedSyncCallGets503WithRetryAfterAfterItsWait(t *testing.T) {
	t.Parallel()
	g, _ := startSlotted(t, 1, 0, "capacity {\n limit 1\n wait 300ms\n}")
	holder := holdSeat(t, g)
	began := time.Now()
	r := g.post(chatPath, "k-saturated", chat("refused"))
	waited := time.Since(began)
	expectError(t, r, http.StatusServiceUnavailable, apierr.CodeUpstreamSaturated, true)
	if waited < 300*time.Millisecond || waited > 1200*time.Millisecond {
		t.Errorf("answered after %v; want about the 300ms wait", waited)
	}
	holder.Wait()
	if st := g.model.Stats(); st.Received != 1 {
		t.Fatalf("the model server received %d calls; the refused one must never reach it", st.Received)
	}
	if n := gatewayPool(t, g).Snapshot().Refused; n != 1 {
		t.Fatalf("%d refusals counted; want the one 503", n)
	}
	// The refusal was not recorded: the key runs once a seat is free.
	if r := g.post(chatPath, "k-saturated", chat("refused")); r.StatusCode != 200 {
		t.Fatalf("retry after the refusal: %d %s", r.StatusCode, r.body)
	}
}

func TestCapacitySaturatedCallThatMayBecomeAsyncIsQueued(t *testing.T) {
	t.Parallel()
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
	if n := gatewayPool(t, g).Snapshot().Refused; n != 0 {
		t.Fatalf("%d refusals counted for a call answered 202; want none", n)
	}
}

func TestCapacityValidationRefusesWhatItCannotHonour(t *testing.T) {
	for _, tc := range []struct {
		cfg  CapacityConfig
		want string
	}{
		{CapacityConfig{Auto: true, Limit: 4, Min: 1, Max: 8}, "limit is either a number or auto <min> <max>, not both"},
		{CapacityConfig{Auto: true, Min: 0, Max: 8}, "limit auto needs 1 <= min <= max, got 0 8"},
		{CapacityConfig{Limit: -1}, "limit must be at least 1, got -1"},
		{CapacityConfig{Limit: 2, Shared: -1}, "shared, wait and max_queue_wait must not be negative"},
		{CapacityConfig{Limit: 2, PassPriority: "tgi"}, `pass_priority must be vllm or sglang, got "tgi"`},
	} {
		if err := tc.cfg.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.cfg, err, tc.want)
		}
	}
	// shared on Badger: one process owns the directory, so there is nothing to share.
	h := Handler{Capacity: &CapacityConfig{Limit: 1, Shared: 2}, conv: &converter{prefix: "/v1/operations"}}
	if err := h.provisionCapacity(storageSpec{backend: BackendBadger, location: t.TempDir()}); err == nil ||
		!strings.Contains(err.Error(), "shared bounds the replicas on one PostgreSQL storage") {
		t.Fatalf("shared on Badger: %v", err)
	}
}

func TestCapacityMaxQueueWaitHeaderOnlyShortensTheConfiguredWait(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		configured time.Duration
		header     string
		want       time.Duration // 0: no deadline
	}{
		{time.Minute, "", time.Minute},
		{time.Minute, "10", 10 * time.Second},
		{time.Minute, "120", time.Minute},
		{time.Minute, "0", time.Minute},
		{time.Minute, "-5", time.Minute},
		{time.Minute, "soon", time.Minute},
		{0, "10", 10 * time.Second},
		{0, "0", 0},
	} {
		r, _ := http.NewRequest("POST", "/", nil)
		if c.header != "" {
			r.Header.Set(headerMaxQueueWait, c.header)
		}
		got := queueDeadline(&CapacityConfig{MaxQueueWait: caddy.Duration(c.configured)}, r, now)
		if want := now.Add(c.want); (c.want == 0 && !got.IsZero()) || (c.want != 0 && !got.Equal(want)) {
			t.Errorf("max_queue_wait %v, Max-Queue-Wait %q: deadline %v; want %v after now", c.configured, c.header, got, c.want)
		}
	}
}

func TestCapacityPassthroughCallWaitsUnderItsHashedScope(t *testing.T) {
	t.Parallel()
	g, _ := startSlotted(t, 1, 0, "capacity {\n limit 1\n wait 5s\n}")
	pool := gatewayPool(t, g)
	holder := holdSeat(t, g)
	waiter := make(chan result, 1)
	go func() { waiter <- g.post(chatPath, "", chat("waits"), "Authorization", "Bearer s3cret") }()
	var scope string
	testkit.WaitFor(t, 5*time.Second, "a call waiting for a seat", func() bool {
		if waiting := pool.Waiting(); len(waiting) == 1 {
			scope = waiting[0].Scope
		}
		return scope != ""
	})
	if scope != idemkey.Scope("Bearer s3cret") {
		t.Fatalf("the call waits under scope %q; want the hash of its credential", scope)
	}
	holder.Wait()
	if r := <-waiter; r.err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("the waiting call: %v %s", r.err, r.body)
	}
}

// heldUpstream holds every call that reaches the upstream until it is opened, counting them.
type heldUpstream struct {
	open     chan struct{}
	opened   sync.Once
	mu       sync.Mutex
	inFlight int
	most     int
}

func newHeldUpstream() *heldUpstream { return &heldUpstream{open: make(chan struct{})} }

func (g *heldUpstream) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.inFlight++
		g.most = max(g.most, g.inFlight)
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			g.inFlight--
			g.mu.Unlock()
		}()
		<-g.open
		next.ServeHTTP(w, r)
	})
}

// release lets every call through, now and from now on.
func (g *heldUpstream) release() { g.opened.Do(func() { close(g.open) }) }

func (g *heldUpstream) counts() (inFlight, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight, g.most
}

// Waiting is not running: with 2 seats and 5 operations, the 3 waiting for a seat are queued
// with no started_at, and the gauges say what the upstream sees: 2 calls.
func TestCapacityOperationWaitingForASeatStaysQueued(t *testing.T) {
	gt := newHeldUpstream()
	g := startGatewayWith(t, gatewaySetup{model: modelserver.Config{Slots: 8}, globals: quietGlobals,
		mulligan: "async {\n concurrency 8\n}\ncapacity {\n limit 2\n}", wrap: gt.wrap})
	t.Cleanup(gt.release) // before the gateway stops, which waits for its calls
	var ids []string
	for range 5 {
		_, op := g.submit(t, "")
		ids = append(ids, op.OperationID)
	}
	testkit.WaitFor(t, 10*time.Second, "two calls at the upstream", func() bool { n, _ := gt.counts(); return n == 2 })
	type view struct {
		Status      string     `json:"status"`
		SubmittedAt time.Time  `json:"submitted_at"`
		StartedAt   *time.Time `json:"started_at"`
	}
	statuses := map[string]int{}
	for _, id := range ids {
		var v view
		if r := g.get("/v1/operations/" + id); r.err != nil || json.Unmarshal(r.body, &v) != nil {
			t.Fatalf("operation %s: %v %s", id, r.err, r.body)
		}
		statuses[v.Status]++
		switch {
		case v.Status == "queued" && v.StartedAt != nil:
			t.Errorf("queued operation %s has started_at %v", id, v.StartedAt)
		case v.Status == "running" && (v.StartedAt == nil || v.StartedAt.Before(v.SubmittedAt)):
			t.Errorf("running operation %s: started_at %v, submitted_at %v", id, v.StartedAt, v.SubmittedAt)
		}
	}
	if statuses["running"] != 2 || statuses["queued"] != 3 {
		t.Fatalf("statuses %v while the upstream has 2 calls; want 2 running, 3 queued", statuses)
	}
	m := g.scrape(t)
	if running, inUse := sum(m, "mulligan_operations_running"), sum(m, "mulligan_capacity_seats_in_use"); running != 2 || inUse != 2 {
		t.Fatalf("mulligan_operations_running %v, mulligan_capacity_seats_in_use %v; want 2 and 2, as the upstream sees", running, inUse)
	}
	gt.release()
	for _, id := range ids {
		if op := g.await(t, id); op.Status != "succeeded" {
			t.Errorf("operation %s: %s", id, op.Status)
		}
	}
	if _, most := gt.counts(); most != 2 {
		t.Fatalf("the upstream saw at most %d calls at once; want 2", most)
	}
}

// A call converted while its first attempt has not yet taken the seat reserved for it keeps
// that seat: the handler, returning once the call is converted, dropped the reserved seat, so
// another caller's call took it, and the attempt waited for a seat again behind it (and could
// be answered 503 UPSTREAM_SATURATED as its outcome). The attempt is held at its start until
// the call is converted, as a loaded machine may hold it.
func TestCapacityConvertedCallKeepsTheSeatReservedForIt(t *testing.T) {
	g, arrived := startSlotted(t, 1, 0, "async {\n mode after 300ms\n}\ncapacity {\n limit 1\n wait 1s\n}")
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func() {
		once.Do(func() {
			close(started)
			<-release
		})
	}
	testHookAttemptStarting.Store(&hook)
	t.Cleanup(func() { testHookAttemptStarting.Store(nil) })
	first := make(chan result, 1)
	go func() { first <- g.post(chatPath, "reserved", chat("reserved"), "X-Mock-Latency", "100ms") }()
	testkit.Receive(t, started, "the first call's attempt starting, its seat reserved")
	other := make(chan result, 1)
	go func() { other <- g.post(chatPath, "other", chat("other"), "X-Mock-Latency", "2s") }()
	testkit.WaitFor(t, 15*time.Second, "the other call waiting for the seat", func() bool {
		return sumWaiting(gatewayPool(t, g).Snapshot()) == 1
	})
	r := testkit.Receive(t, first, "the first call converted")
	if r.StatusCode != http.StatusAccepted {
		t.Fatalf("the first call: %d %s, want 202 once its window passed", r.StatusCode, r.body)
	}
	close(release)
	op := g.await(t, decodeOp(t, r).OperationID)
	if op.Status != "succeeded" {
		t.Fatalf("the converted call ended %s %+v", op.Status, op.Error)
	}
	if got := arrived.order(); len(got) == 0 || got[0] != "reserved" {
		t.Fatalf("the model server saw %v: the converted call's reserved seat went to another call first", got)
	}
	testkit.Receive(t, other, "the other call")
}

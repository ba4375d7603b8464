package modelserver_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// pending is a model request sent in the background: its answer (or error)
// arrives on done; cancel abandons it.
type pending struct {
	cancel context.CancelFunc
	done   chan result
}

type result struct {
	resp *http.Response
	err  error
}

// sendAsync posts chatBody to ts in the background with the given headers.
func sendAsync(t *testing.T, ts *httptest.Server, headers map[string]string) *pending {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	p := &pending{cancel: cancel, done: make(chan result, 1)}
	go func() {
		resp, err := ts.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		p.done <- result{resp, err}
	}()
	return p
}

// answer waits (at most 10s) for p's answer and fails unless it is 200.
func (p *pending) answer(t *testing.T) *http.Response {
	t.Helper()
	select {
	case r := <-p.done:
		if r.err != nil || r.resp.StatusCode != http.StatusOK {
			t.Fatalf("answer: %v %v", r.err, r.resp)
		}
		return r.resp
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s")
		return nil
	}
}

// canceled waits (at most 10s) for p's client to see its cancellation.
func (p *pending) canceled(t *testing.T) {
	t.Helper()
	p.cancel()
	select {
	case r := <-p.done:
		if !errors.Is(r.err, context.Canceled) {
			t.Fatalf("canceled request ended with %v %v, want context.Canceled", r.err, r.resp)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("canceled request did not end within 10s")
	}
}

// holdSlot is a header set that keeps a request in its slot until canceled.
var holdSlot = map[string]string{"X-Mock-Latency": "1m"}

func TestSlotsRunAtMostNAndQueueTheRestFirstComeFirstServed(t *testing.T) {
	ms, ts := newServer(t, modelserver.Config{Slots: 2})
	seats := make(chan int64, 16)
	modelserver.OnSeated(ms, func(id int64) { seats <- id })

	a, b := sendAsync(t, ts, holdSlot), sendAsync(t, ts, holdSlot)
	waitStats(t, ts, "both slots taken", func(st modelserver.Stats) bool { return st.Running == 2 })
	var queued []*pending
	for i := range 3 { // one at a time, so that their arrival order is known
		queued = append(queued, sendAsync(t, ts, nil))
		waitStats(t, ts, "one more queued", func(st modelserver.Stats) bool { return st.Queued == int64(i+1) })
	}
	if st := stats(t, ts); st.Running != 2 || st.InFlight != 5 {
		t.Fatalf("running %d in flight %d, want 2 and 5", st.Running, st.InFlight)
	}
	a.canceled(t)
	b.canceled(t)

	var ids []string
	for _, p := range queued {
		resp := p.answer(t)
		ids = append(ids, resp.Header.Get("X-Execution-Id"))
		if d, err := time.ParseDuration(resp.Header.Get("X-Queue-Wait")); err != nil || d <= 0 {
			t.Errorf("X-Queue-Wait %q of a queued request, want a positive duration", resp.Header.Get("X-Queue-Wait"))
		}
	}
	close(seats)
	var order []string
	for id := range seats {
		order = append(order, strconv.FormatInt(id, 10))
	}
	if len(order) != 5 || strings.Join(order[2:], ",") != strings.Join(ids, ",") {
		t.Errorf("slots taken in the order %v; want the two holders, then %v in arrival order", order, ids)
	}
	// The client sees its cancellation before the server does: wait for both holders to end.
	st := waitStats(t, ts, "every request ended", func(st modelserver.Stats) bool { return st.InFlight == 0 })
	if st.MaxRunning != 2 || st.MaxQueued != 3 || st.MaxInFlight != 5 || st.Running != 0 || st.Queued != 0 {
		t.Errorf("max running %d queued %d in flight %d, now running %d queued %d; want 2 3 5, 0 0",
			st.MaxRunning, st.MaxQueued, st.MaxInFlight, st.Running, st.Queued)
	}
	wantCounts(t, st, 5, 3, 2, 0, 0)
}

func TestRequestAbandonedInTheQueueLeavesIt(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{Slots: 1})
	holder := sendAsync(t, ts, holdSlot)
	waitStats(t, ts, "the slot taken", func(st modelserver.Stats) bool { return st.Running == 1 })
	gone := sendAsync(t, ts, nil)
	waitStats(t, ts, "a request queued", func(st modelserver.Stats) bool { return st.Queued == 1 })
	gone.canceled(t)
	waitStats(t, ts, "the queue empty again", func(st modelserver.Stats) bool { return st.Queued == 0 && st.Abandoned == 1 })

	next := sendAsync(t, ts, nil)
	waitStats(t, ts, "the next request queued", func(st modelserver.Stats) bool { return st.Queued == 1 })
	holder.canceled(t)
	next.answer(t)
	st := stats(t, ts)
	wantCounts(t, st, 3, 1, 2, 0, 0)
	if st.Seated != 2 {
		t.Errorf("%d requests took a slot, want 2 (the holder and the last one)", st.Seated)
	}
}

func TestSlotStatsMeasureBusySlotsAndTheQueue(t *testing.T) {
	const n, latency = 10, 100 * time.Millisecond
	_, ts := newServer(t, modelserver.Config{Slots: 2, Latency: latency})
	var all []*pending
	for range n {
		all = append(all, sendAsync(t, ts, nil))
	}
	busy := waitStats(t, ts, "a queue", func(st modelserver.Stats) bool { return st.Queued > 0 })
	drained := waitStats(t, ts, "the queue drained", func(st modelserver.Stats) bool { return st.Queued == 0 })
	for _, p := range all {
		p.answer(t)
	}
	if u := drained.Sub(busy).Utilisation(); u < 0.9 || u > 1.0001 {
		t.Errorf("utilisation while requests waited %.3f, want about 1 (both slots busy)", u)
	}
	st := stats(t, ts)
	if st.Seated != n || st.BusySlotTime < n*latency || st.BusySlotTime > time.Duration(st.Slots)*st.Window {
		t.Errorf("seated %d, busy slot time %v in a window of %v; want %d, at least %v, at most 2 × the window",
			st.Seated, st.BusySlotTime, st.Window, n, n*latency)
	}
	// The integral of the queue length is the sum of the waits.
	if diff := st.QueuedTime - st.QueueWaitTotal; diff < -time.Millisecond || diff > time.Millisecond {
		t.Errorf("queued time %v, sum of waits %v: want them equal", st.QueuedTime, st.QueueWaitTotal)
	}
	if st.QueueWaitMax < latency || st.MeanQueued() <= 0 {
		t.Errorf("longest wait %v, mean queue %.2f; want at least one latency and above 0", st.QueueWaitMax, st.MeanQueued())
	}
}

func TestWithoutSlotsNothingQueues(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	resp, _ := post(t, ts, "/v1/chat/completions", chatBody, nil)
	if got := resp.Header.Get("X-Queue-Wait"); got != "0s" {
		t.Errorf("X-Queue-Wait %q, want 0s", got)
	}
	st := stats(t, ts)
	if st.Slots != 0 || st.MaxQueued != 0 || st.MaxRunning != 1 || st.Seated != 1 || st.Utilisation() != 0 {
		t.Errorf("stats %+v: want no slots, nothing queued, one request run", st)
	}
}

func TestResetStartsANewWindow(t *testing.T) {
	ms, ts := newServer(t, modelserver.Config{Slots: 1})
	holder := sendAsync(t, ts, holdSlot)
	waitStats(t, ts, "the slot taken", func(st modelserver.Stats) bool { return st.Running == 1 })
	queued := sendAsync(t, ts, nil)
	waitStats(t, ts, "a request queued", func(st modelserver.Stats) bool { return st.Queued == 1 })
	ms.Reset()
	st := ms.Stats()
	if st.MaxRunning != 1 || st.MaxQueued != 1 || st.MaxInFlight != 2 || st.Seated != 0 || st.BusySlotTime > st.Window {
		t.Errorf("after Reset: %+v; want the maxima at the current gauges, totals from zero", st)
	}
	holder.canceled(t)
	queued.answer(t)
	if st := ms.Stats(); st.Seated != 1 || st.Running != 0 {
		t.Errorf("seated %d running %d after the queued request ran, want 1 and 0", st.Seated, st.Running)
	}
}

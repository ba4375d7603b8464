package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// The flood scenario (docs/operating.md, "Capacity under a flood"): a model server with
// FloodSlots slots and FloodLatency calls, queueing the rest first come first served as
// inference servers do; one tenant floods it with FloodCalls low-urgency calls (u=7) at
// floodFactor times its capacity, held open (sync) or as operations (async), while another
// tenant sends an interactive call (u=0) every FloodEvery until the flood is done.

// floodFactor is how many times the model server's capacity (slots / latency) the flood
// arrives at.
const floodFactor = 20

// unloadedCalls is how many interactive calls, one at a time on an idle model server, measure a
// side's unloaded call time.
const unloadedCalls = 10

// sampleEvery is how often the model server's counters are read during a flood.
const sampleEvery = 20 * time.Millisecond

// The floods, each against every side (docs/capacity.md, "Under a flood").
const (
	floodSync      = "sync"       // held-open u=7 calls of one tenant
	floodAsync     = "async"      // the same as operations (Mulligan sides only)
	floodMixed     = "mixed"      // held open, of lengths from 1 to 15 times the model server's latency
	floodFastError = "fast-error" // held open, while a third tenant gets an instant 400 every 20 ms
	floodForged    = "forged"     // the flood claims Priority u=0; the interactive calls send none
	floodMinted    = "minted"     // a fresh credential per flood call, default urgency; interactive sends none
)

// floodKinds are the floods in the order they run.
var floodKinds = []string{floodSync, floodAsync, floodMixed, floodFastError, floodForged, floodMinted}

// mixedSpread is how many lengths the mixed flood's calls take: 1..mixedSpread times the model
// server's latency.
const mixedSpread = 15

// mixedLength is how many times the model server's latency flood call i of the mixed flood takes.
func mixedLength(i int) int { return 1 + (i*7)%mixedSpread }

// answerTokens is how many tokens the model server answers a chatBody of two words with
// ("You said: flood 12"): the length of a call that takes its latency.
const answerTokens = 4

// floodBody is the body of flood call i of kind. The mixed flood's calls are generations of
// different lengths, as on a real model server: max_tokens in proportion to the time they take,
// so that their usage says how long they are (a model server's time per output token is about
// the same for every call; the interactive calls' answers are answerTokens long).
func floodBody(kind string, i int) []byte {
	body := chatBody(fmt.Sprint("flood ", i))
	if kind == floodMixed {
		return fmt.Appendf(body[:len(body)-1], `,"max_tokens":%d}`, answerTokens*mixedLength(i))
	}
	return body
}

// noiseEvery paces the fast-error flood's instant 400s.
const noiseEvery = 20 * time.Millisecond

// floodHeaders are the headers of flood call i of kind.
func floodHeaders(kind string, i int, latency time.Duration) []string {
	switch kind {
	case floodMixed:
		length := latency * time.Duration(mixedLength(i))
		return []string{"Authorization", floodTenant, "Priority", "u=7", "X-Mock-Latency", length.String()}
	case floodForged:
		return []string{"Authorization", floodTenant, "Priority", "u=0"}
	case floodMinted:
		return []string{"Authorization", fmt.Sprintf("Bearer minted-%d", i)}
	}
	return []string{"Authorization", floodTenant, "Priority", "u=7"}
}

// interactivePriority is the Priority of the interactive calls during kind: none against a
// flood that forges urgency or mints credentials, whose point is the honest tenant's share.
func interactivePriority(kind string) string {
	if kind == floodForged || kind == floodMinted {
		return ""
	}
	return "u=0"
}

// The tenants: their Authorization headers are their scopes on the Mulligan sides.
const (
	floodTenant       = "Bearer flood-tenant"
	interactiveTenant = "Bearer interactive-tenant"
)

// floodModel is the flood's model server, on its own loopback port.
type floodModel struct {
	*modelserver.Server
	srv  *http.Server
	addr string
}

// startFloodModel serves a model server with the flood's slots and latency.
func (h *harness) startFloodModel() (*floodModel, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	m := &floodModel{Server: modelserver.New(modelserver.Config{Slots: h.cfg.FloodSlots, Latency: h.cfg.FloodLatency})}
	m.srv = &http.Server{Handler: m.Server, ReadHeaderTimeout: 10 * time.Second}
	m.addr = l.Addr().String()
	go func() { _ = m.srv.Serve(l) }()
	return m, nil
}

// flood runs both floods against every side, the sync flood first, and keeps the rows in
// h.floodRows.
func (h *harness) flood(ctx context.Context) error {
	model, err := h.startFloodModel()
	if err != nil {
		return err
	}
	defer model.srv.Close()
	sides, err := h.startFloodSides(ctx, model.addr)
	defer stopFloodSides(sides)
	if err != nil {
		return err
	}
	client := newClient(h.cfg.FloodCalls)
	client.Timeout = h.floodDeadline()
	defer client.CloseIdleConnections()
	unloaded := map[string]time.Duration{}
	for _, kind := range floodKinds {
		if len(h.cfg.Floods) > 0 && !slices.Contains(h.cfg.Floods, kind) {
			continue
		}
		for _, s := range sides {
			row := FloodRow{Flood: kind, Side: s.name, Missing: s.missing}
			if kind == floodAsync && !s.mulligan { // whether or not the side started: it has no operations
				row.Missing = "n/a: no operations"
			}
			if s.gw != nil && row.Missing == "" {
				if _, ok := unloaded[s.name]; !ok {
					unloaded[s.name] = h.unloadedCall(ctx, client, s.gw.base)
				}
				row.Unloaded = unloaded[s.name]
				h.logf("flood: %s flood on %s", kind, s.name)
				r := &floodRun{h: h, model: model, client: client, gw: s.gw, kind: kind}
				r.run(ctx, &row)
			}
			h.floodRows = append(h.floodRows, row)
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// floodDeadline bounds one flood: three times its drain time at full speed (the mixed flood's
// calls are mixedSpread times longer at most), and 30 s more.
func (h *harness) floodDeadline() time.Duration {
	drain := time.Duration(h.cfg.FloodCalls) * h.cfg.FloodLatency / time.Duration(h.cfg.FloodSlots)
	return 3*mixedSpread*drain + 30*time.Second
}

// unloadedCall is the median of unloadedCalls interactive calls sent one at a time.
func (h *harness) unloadedCall(ctx context.Context, client *http.Client, base string) time.Duration {
	var s sample
	for i := range unloadedCalls {
		t0 := time.Now()
		err := interactiveCall(ctx, client, base, i, "u=0")
		s.record(time.Since(t0), err)
	}
	return s.percentile(50)
}

// interactiveCall is one call of the interactive tenant, expecting 200; priority "" sends none.
func interactiveCall(ctx context.Context, client *http.Client, base string, n int, priority string) error {
	headers := []string{"Authorization", interactiveTenant}
	if priority != "" {
		headers = append(headers, "Priority", priority)
	}
	resp, body, err := send(ctx, client, http.MethodPost, base+chatPath, chatBody(fmt.Sprint("interactive ", n)), headers...)
	if err != nil {
		return err
	}
	return expectStatus(resp, body, http.StatusOK)
}

// floodRun is one flood against one side.
type floodRun struct {
	h      *harness
	model  *floodModel
	client *http.Client
	gw     *gateway // its calls go to its replicas in turn (gateway.pick)
	kind   string
	start  time.Time

	// issued counts calls sent toward the model server (for the async flood: accepted
	// operations), refused those answered without reaching it.
	issued, refused atomic.Int64

	mu       sync.Mutex
	flood    sample // flood calls: from their scheduled send to done
	inter    sample // interactive calls: from their scheduled send to the answer
	lastDone time.Time
}

// run floods the side, sends the interactive calls until the flood is done, and fills row.
func (r *floodRun) run(ctx context.Context, row *FloodRow) {
	ctx, cancel := context.WithTimeout(ctx, r.h.floodDeadline())
	defer cancel()
	r.model.Reset()
	r.start = time.Now()
	watch := r.watchSlots()
	floodDone := make(chan struct{})
	interDone := make(chan struct{})
	go func() { defer close(interDone); r.interactive(ctx, floodDone) }()
	noiseDone := make(chan struct{})
	if r.kind == floodFastError {
		go func() { defer close(noiseDone); r.noise(ctx, floodDone) }()
	} else {
		close(noiseDone)
	}
	r.sendFlood(ctx)
	close(floodDone)
	<-interDone
	<-noiseDone
	slots := watch.stop()
	r.fill(row, slots)
}

// sendFlood sends the flood open loop at floodFactor times the model server's capacity and
// returns when every flood call is done (answered, or its operation finished).
func (r *floodRun) sendFlood(ctx context.Context) {
	cfg := r.h.cfg
	every := cfg.FloodLatency / time.Duration(floodFactor*cfg.FloodSlots)
	subs := make([]submission, cfg.FloodCalls)
	var wg sync.WaitGroup
	for i := range cfg.FloodCalls {
		at := r.start.Add(time.Duration(i) * every)
		if !sleepUntil(ctx, at) {
			break
		}
		wg.Go(func() {
			if r.kind != floodAsync {
				r.syncFloodCall(ctx, at, i)
				return
			}
			subs[i] = r.submitFloodCall(ctx, at, i)
		})
	}
	wg.Wait()
	if r.kind == floodAsync {
		r.awaitOperations(ctx, subs)
	}
}

// syncFloodCall is one held-open flood call.
func (r *floodRun) syncFloodCall(ctx context.Context, at time.Time, i int) {
	r.issued.Add(1)
	resp, body, err := send(ctx, r.client, http.MethodPost, r.gw.pick(int64(i))+chatPath, floodBody(r.kind, i),
		floodHeaders(r.kind, i, r.h.cfg.FloodLatency)...)
	if err == nil {
		err = expectStatus(resp, body, http.StatusOK)
		if err != nil {
			r.refused.Add(1) // the model server never fails: the gateway answered this itself
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.flood.record(time.Since(at), err)
	if err == nil {
		r.lastDone = maxTime(r.lastDone, time.Now())
	}
}

// submitFloodCall submits one flood operation; a refused one is recorded at once.
func (r *floodRun) submitFloodCall(ctx context.Context, at time.Time, i int) submission {
	id, err := r.h.submit(ctx, r.gw.pick(int64(i)), fmt.Sprint("flood ", i), "Authorization", floodTenant, "Priority", "u=7")
	if err != nil {
		r.mu.Lock()
		r.flood.record(0, err)
		r.mu.Unlock()
		return submission{}
	}
	r.issued.Add(1)
	return submission{id: id, at: at}
}

// awaitOperations polls the accepted operations, oldest first (the order both Mulligan sides
// run one tenant's operations of one urgency in), until each is done.
func (r *floodRun) awaitOperations(ctx context.Context, subs []submission) {
	subs = slices.DeleteFunc(subs, func(s submission) bool { return s.id == "" })
	slices.SortFunc(subs, func(a, b submission) int { return strings.Compare(a.id, b.id) })
	for _, s := range subs {
		for {
			v, err := r.h.getOperation(ctx, r.gw.pick(0), s.id, "Authorization", floodTenant)
			if err == nil && !v.Done {
				if sleepUntil(ctx, time.Now().Add(sampleEvery)) {
					continue
				}
				err = ctx.Err()
			}
			if err == nil && v.Status != "succeeded" {
				err = fmt.Errorf("operation %s ended %s", v.OperationID, v.Status)
			}
			r.mu.Lock()
			r.flood.record(time.Since(s.at), err)
			if err == nil {
				r.lastDone = maxTime(r.lastDone, time.Now())
			}
			r.mu.Unlock()
			break
		}
	}
}

// interactive sends an interactive call every FloodEvery, each on its own, until the flood is
// done, and waits for their answers.
func (r *floodRun) interactive(ctx context.Context, floodDone <-chan struct{}) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ; i++ {
		at := r.start.Add(time.Duration(i) * r.h.cfg.FloodEvery)
		select {
		case <-floodDone:
			return
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		wg.Go(func() {
			r.issued.Add(1)
			err := interactiveCall(ctx, r.client, r.gw.pick(int64(i)), i, interactivePriority(r.kind))
			if err != nil {
				r.refused.Add(1)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.inter.record(time.Since(at), err)
		})
	}
}

// noise is the fast-error flood's third tenant: a call the model server answers 400 at once,
// every noiseEvery until the flood is done. Its answers are not counted: they only must not
// move the gateway's limit.
func (r *floodRun) noise(ctx context.Context, floodDone <-chan struct{}) {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(noiseEvery)
	defer t.Stop()
	for {
		select {
		case <-floodDone:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		wg.Go(func() {
			_, _, _ = send(ctx, r.client, http.MethodPost, r.gw.pick(0)+chatPath, chatBody("noise"),
				"Authorization", "Bearer noise-tenant", "X-Mock-Status", "400", "X-Mock-Latency", "0s")
		})
	}
}

// sleepUntil waits until t and reports whether ctx is still live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

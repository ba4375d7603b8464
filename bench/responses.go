package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The responses scenario (docs/responses.md): a background response's first event through
// Mulligan (`responses /v1`: stored before the answer, claimed by the runner, the upstream's
// stream recorded and relayed renumbered) against a direct streamed call through plain Caddy,
// one client at a time, and the gateways' memory with LiveStreams background streams live at
// once. The upstream (respSource) sends its first event at once, so the time to it is what each
// gateway adds. The Mulligan gateways are the scenario's own (Badger, `responses /v1`; for the
// memory one whose runner is wide enough to run every live stream at once).
const ScenarioResponses = "responses"

// respEvents are the events of the bench upstream's answer, after response.created.
var respEvents = []string{"response.in_progress", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta", "response.completed"}

// respSource answers POST /v1/responses with a short streamed response, flushed event by
// event; with ?hold=1 it sends the first event and then waits for releaseAll.
type respSource struct {
	*holdGate
}

func (s *respSource) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	release := s.held()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	write := func(typ string, seq int) bool {
		_, err := fmt.Fprintf(w, "event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,\"delta\":\"x\",\"response\":{\"id\":\"resp_up\",\"object\":\"response\",\"status\":\"in_progress\"}}\n\n", typ, typ, seq)
		return err == nil && rc.Flush() == nil
	}
	if !write("response.created", 0) {
		return
	}
	if r.URL.Query().Get("hold") == "1" {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
	}
	for i, typ := range respEvents {
		if !write(typ, i+1) {
			return
		}
	}
}

// responses runs the scenario against plain Caddy and a Mulligan gateway of its own, both in
// front of respSource.
func (h *harness) responses(ctx context.Context) ([]Row, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	src := &respSource{holdGate: newHoldGate()}
	srv := &http.Server{Handler: src, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	up := l.Addr().String()
	plain, err := h.startGateway(ctx, "responses-plain", func(int) string { return plainSite(up) })
	if err != nil {
		return nil, err
	}
	defer plain.stop()
	mull, err := h.startGateway(ctx, "responses", func(int) string { return mulliganSite(up, h.badgerDir("responses"), "\t\tresponses /v1\n") })
	if err != nil {
		return nil, err
	}
	defer mull.stop()

	rows := []Row{h.respFirstEvent(ctx, plain, mull)}
	if err := ctx.Err(); err != nil {
		return rows, err
	}
	row, err := h.respMemory(ctx, up, plain, src)
	return append(rows, row), err
}

// respFirstEvent measures the time to the upstream's first event through plain Caddy (a direct
// stream) and through Mulligan (a background one), in interleaved rounds.
func (h *harness) respFirstEvent(ctx context.Context, plain, mull *gateway) Row {
	var ps, ms sample
	for r := range h.cfg.Rounds {
		sides := []struct {
			g  *gateway
			bg bool
			s  *sample
		}{{plain, false, &ps}, {mull, true, &ms}}
		if r%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, side := range sides {
			s := measured(1, h.respStep(ctx, side.g, side.bg))
			h.logf("%s: round %d/%d %-16s %8.0f/s  p50 %s  errors %d", ScenarioResponses, r+1, h.cfg.Rounds, side.g.name, s.rps(), fmtDuration(s.percentile(50)), s.errs)
			side.s.add(s)
		}
	}
	return Row{Scenario: "responses: time to first event, one client (background stream vs direct stream)",
		Plain: resultOf(ps), Mulligan: []*Result{resultOf(ms)},
		Note: fmt.Sprintf("req/s: streams/s; p50/p99: time to the upstream's first event; Mulligan (Badger, responses /v1) adds %s at p50, %s at p99",
			signed(ms.percentile(50)-ps.percentile(50)), signed(ms.percentile(99)-ps.percentile(99)))}
}

// respMemory reads plain Caddy's and a Mulligan gateway's memory with LiveStreams streams live.
// Every live background stream is a running operation: that gateway's runner runs that many at
// once.
func (h *harness) respMemory(ctx context.Context, up string, plain *gateway, src *respSource) (Row, error) {
	row := Row{Scenario: fmt.Sprintf("responses: %d concurrent background streams live", h.cfg.LiveStreams)}
	extra := fmt.Sprintf("\t\tresponses /v1\n\t\tasync {\n\t\t\tconcurrency %d\n\t\t}\n", h.cfg.LiveStreams+64)
	wide, err := h.startGateway(ctx, "responses-wide", func(int) string { return mulliganSite(up, h.badgerDir("responses-wide"), extra) })
	if err != nil {
		return row, err
	}
	defer wide.stop()
	var notes []string
	for _, side := range []struct {
		g  *gateway
		bg bool
	}{{plain, false}, {wide, true}} {
		before, err := side.g.rssBytes()
		if err != nil {
			return row, err
		}
		during, err := h.holdResponses(ctx, side.g, side.bg, src)
		if err != nil {
			return row, fmt.Errorf("%s: %w", side.g.name, err)
		}
		notes = append(notes, fmt.Sprintf("%s RSS %s idle, %s with them live (%s anonymous)", side.g.name, mib(before), mib(during.rss), mib(during.anon)))
	}
	row.Note = strings.Join(notes, "; ")
	return row, nil
}

// respStep is one client creating streamed responses for a round (background ones when bg) and
// recording the time to the upstream's first event; every event must arrive.
func (h *harness) respStep(ctx context.Context, g *gateway, bg bool) func(s *sample) bool {
	deadline := time.Now().Add(h.cfg.Duration)
	return func(s *sample) bool {
		if ctx.Err() != nil || !time.Now().Before(deadline) {
			return false
		}
		first, n, err := h.readResponse(ctx, g.base, bg, false, nil)
		if want := 1 + len(respEvents); err == nil && n != want {
			err = fmt.Errorf("got %d of %d upstream events", n, want)
		}
		s.record(first, err)
		return true
	}
}

// readResponse creates a streamed response (in the background when bg) and reads it to the end:
// the time to the upstream's first event (through Mulligan the second event, after its own
// response.queued) and how many upstream events came. firstEvent, when set, is called then.
func (h *harness) readResponse(ctx context.Context, base string, bg, hold bool, firstEvent func()) (time.Duration, int, error) {
	url := base + "/v1/responses"
	if hold {
		url += "?hold=1"
	}
	body := fmt.Sprintf(`{"model":"bench","input":"%s","stream":true,"background":%t}`, h.runID, bg)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("/v1/responses: %d", resp.StatusCode)
	}
	var first time.Duration
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") || strings.Contains(line, `"type":"response.queued"`) {
			continue
		}
		if n++; n == 1 {
			first = time.Since(t0)
			if firstEvent != nil {
				firstEvent()
			}
		}
	}
	return first, n, sc.Err()
}

// holdResponses opens LiveStreams held streamed responses on g, measures g's RSS once every one
// has delivered the upstream's first event, then releases them and waits for them to end.
func (h *harness) holdResponses(ctx context.Context, g *gateway, bg bool, src *respSource) (held, error) {
	ctx, cancel := context.WithTimeout(ctx, liveStreamWait)
	defer cancel()
	var started, ended sync.WaitGroup
	var failed atomic.Value
	started.Add(h.cfg.LiveStreams)
	for range h.cfg.LiveStreams {
		ended.Go(func() {
			var once sync.Once
			_, n, err := h.readResponse(ctx, g.base, bg, true, func() { once.Do(started.Done) })
			once.Do(started.Done)
			if want := 1 + len(respEvents); err == nil && n != want {
				err = fmt.Errorf("got %d of %d upstream events", n, want)
			}
			if err != nil {
				failed.CompareAndSwap(nil, err)
			}
		})
	}
	started.Wait()
	rss, err := g.rssBytes()
	anon, _ := g.procStatus("RssAnon")
	h.liveProfiles(ctx, "responses-live", g)
	src.releaseAll()
	ended.Wait()
	if e, _ := failed.Load().(error); e != nil {
		return held{}, e
	}
	return held{rss: rss, anon: anon}, err
}

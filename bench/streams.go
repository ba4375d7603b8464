package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// streamPath is the bench upstream's Server-Sent Events endpoint, beside the model server.
const streamPath = "/v1/bench/stream"

// Shapes of the streams scenario.
const (
	ttfbEvents, ttfbSize = 20, 100     // a short chat answer
	bulkEvents, bulkSize = 20_000, 400 // an 8 MB answer, for throughput
	liveStreamWait       = time.Minute // how long opening them all may take
)

// streamSource answers POST streamPath?events=N&size=B with N events of about B bytes each,
// flushed one by one, as fast as the connection takes them, or with every=D one per D after
// the first (a model server's pace). With hold=1 it sends the first event and then waits for
// releaseAll.
type streamSource struct {
	*holdGate
}

func newStreamSource() *streamSource { return &streamSource{holdGate: newHoldGate()} }

func (s *streamSource) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	q := r.URL.Query()
	events, _ := strconv.Atoi(q.Get("events"))
	size, _ := strconv.Atoi(q.Get("size"))
	every, _ := time.ParseDuration(q.Get("every"))
	release := s.held()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	pad := strings.Repeat("x", max(size-40, 0))
	for i := 1; i <= events; i++ {
		if _, err := fmt.Fprintf(w, "data: {\"n\":%d,\"pad\":%q}\n\n", i, pad); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
		if i == 1 && q.Get("hold") == "1" {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		if every > 0 && i < events {
			select {
			case <-time.After(every):
			case <-r.Context().Done():
				return
			}
		}
	}
}

// streams measures keyed Server-Sent Events relayed through Mulligan (recorded event by event)
// against plain Caddy's reverse_proxy: time to first event, throughput of one large stream, and
// the gateways' memory with many live streams open at once (cfg.LiveStreams).
func (h *harness) streams(ctx context.Context) ([]Row, error) {
	// One client at a time first: the time to the first event is then what relaying through
	// the gateway adds, without queueing behind other streams.
	alone := func(g *gateway) (sample, error) {
		return measured(1, h.streamStep(ctx, g, ttfbEvents, ttfbSize, false)), nil
	}
	plain, mull, err := h.alternate(ctx, ScenarioStreams+" ttfb alone", alone)
	rows := []Row{{Scenario: fmt.Sprintf("stream: time to first event, one client (%d events, new key)", ttfbEvents),
		Plain: resultOf(plain), Mulligan: resultsOf(mull), Note: "req/s: streams/s; p50/p99: time to the first event"}}
	if err != nil {
		return rows, err
	}
	ttfb := func(g *gateway) (sample, error) {
		return measured(h.cfg.Concurrency, h.streamStep(ctx, g, ttfbEvents, ttfbSize, false)), nil
	}
	plain, mull, err = h.alternate(ctx, ScenarioStreams+" ttfb", ttfb)
	rows = append(rows, Row{Scenario: fmt.Sprintf("stream: time to first event (%d events, new key)", ttfbEvents),
		Plain: resultOf(plain), Mulligan: resultsOf(mull), Note: "req/s: streams/s; p50/p99: time to the first event"})
	if err != nil {
		return rows, err
	}
	bulk := func(g *gateway) (sample, error) {
		return measured(1, h.streamStep(ctx, g, bulkEvents, bulkSize, true)), nil
	}
	plain, mull, err = h.alternate(ctx, ScenarioStreams+" throughput", bulk)
	rows = append(rows, Row{Scenario: fmt.Sprintf("stream: throughput (%d events of %d B, one at a time)", bulkEvents, bulkSize),
		Plain: throughputOf(plain), Mulligan: throughputsOf(mull), Note: "req/s column: MiB/s relayed; p50/p99: whole stream"})
	if err != nil {
		return rows, err
	}
	row, err := h.liveStreamMemory(ctx)
	return append(rows, row), err
}

// streamStep is one client sending keyed streaming requests for a round: it records the time to
// the first event, or with whole the time of the whole stream, and checks every event arrived.
func (h *harness) streamStep(ctx context.Context, g *gateway, events, size int, whole bool) func(s *sample) bool {
	deadline := time.Now().Add(h.cfg.Duration)
	return func(s *sample) bool {
		if ctx.Err() != nil || !time.Now().Before(deadline) {
			return false
		}
		key := fmt.Sprintf("%s-stream-%d", h.runID, h.seq.Add(1))
		first, total, n, err := h.readStream(ctx, g.base, key, streamShape{events: events, size: size}, nil)
		if err == nil && n != events {
			err = fmt.Errorf("got %d of %d events", n, events)
		}
		if whole {
			first = total
		}
		s.record(first, err)
		if err == nil {
			s.bytes += int64(events * size)
		}
		return true
	}
}

// streamShape is what a streaming request asks of the bench upstream (streamSource): how many
// events of about how many bytes, whether it holds the stream open after the first, and the
// pace of the rest (zero: as fast as the connection takes them).
type streamShape struct {
	events, size int
	hold         bool
	every        time.Duration
}

// readStream posts a keyed streaming request and reads it to the end: the time to the first
// event, to the end, and how many events came. With shape.hold the upstream holds the stream
// open after its first event; firstEvent (if not nil) is called when that event arrives.
func (h *harness) readStream(ctx context.Context, base, key string, shape streamShape, firstEvent func()) (time.Duration, time.Duration, int, error) {
	url := fmt.Sprintf("%s%s?events=%d&size=%d", base, streamPath, shape.events, shape.size)
	if shape.hold {
		url += "&hold=1"
	}
	if shape.every > 0 {
		url += "&every=" + shape.every.String()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(chatBody(key)))
	if err != nil {
		return 0, 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	t0 := time.Now()
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, 0, fmt.Errorf("%s: %d", streamPath, resp.StatusCode)
	}
	var first time.Duration
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), "data: ") {
			continue
		}
		if n++; n == 1 {
			first = time.Since(t0)
			if firstEvent != nil {
				firstEvent()
			}
		}
	}
	return first, time.Since(t0), n, sc.Err()
}

// throughputOf is a bulk round's result with its rate in MiB/s.
func throughputOf(s sample) *Result {
	r := resultOf(s)
	if s.elapsed > 0 {
		r.RPS = float64(s.bytes) / (1 << 20) / s.elapsed.Seconds()
	}
	return r
}

// throughputsOf is throughputOf of each sample.
func throughputsOf(ss []sample) []*Result {
	out := make([]*Result, len(ss))
	for i := range ss {
		out[i] = throughputOf(ss[i])
	}
	return out
}

// liveStreamMemory opens cfg.LiveStreams keyed streams on each gateway at once, each held open by
// the upstream after its first event, and reads the gateway's resident memory while all of
// them are live.
func (h *harness) liveStreamMemory(ctx context.Context) (Row, error) {
	row := Row{Scenario: fmt.Sprintf("stream: %d concurrent live streams", h.cfg.LiveStreams)}
	var notes []string
	for _, g := range h.gateways() {
		before, err := g.rssBytes()
		if err != nil {
			return row, err
		}
		during, err := h.holdStreams(ctx, g)
		if err != nil {
			return row, fmt.Errorf("%s: %w", g.name, err)
		}
		notes = append(notes, fmt.Sprintf("%s RSS %s idle, %s with them live (%s anonymous)", g.name, mib(before), mib(during.rss), mib(during.anon)))
	}
	row.Note = strings.Join(notes, "; ")
	return row, nil
}

// holdStreams opens cfg.LiveStreams held streams on g, measures g's RSS once every one of them has
// delivered its first event, then releases them and waits for them to end.
func (h *harness) holdStreams(ctx context.Context, g *gateway) (held, error) {
	ctx, cancel := context.WithTimeout(ctx, liveStreamWait)
	defer cancel()
	var started sync.WaitGroup
	var ended sync.WaitGroup
	var failed atomic.Value
	started.Add(h.cfg.LiveStreams)
	for i := range h.cfg.LiveStreams {
		ended.Go(func() {
			key := fmt.Sprintf("%s-live-%s-%d", h.runID, strings.ReplaceAll(g.name, "×", "x"), i) // a key is ASCII
			var once sync.Once
			_, _, n, err := h.readStream(ctx, g.base, key, streamShape{events: ttfbEvents, size: ttfbSize, hold: true}, func() { once.Do(started.Done) })
			once.Do(started.Done)
			if err == nil && n != ttfbEvents {
				err = fmt.Errorf("got %d of %d events", n, ttfbEvents)
			}
			if err != nil {
				failed.CompareAndSwap(nil, err)
			}
		})
	}
	started.Wait()
	rss, err := g.rssBytes()
	anon, _ := g.procStatus("RssAnon")
	h.liveProfiles(ctx, "streams-live", g)
	h.source.releaseAll()
	ended.Wait()
	if e, _ := failed.Load().(error); e != nil {
		return held{}, e
	}
	return held{rss: rss, anon: anon}, err
}

// held is a gateway's resident memory with the streams live: all of it, and its anonymous part
// (the heap, stacks; the rest is files mapped: the binary, Badger's logs).
type held struct{ rss, anon int64 }

// liveProfiles writes each gateway's runtime memory statistics with the streams live (the
// heap's, the goroutines' stacks) to ProfileDir/<prefix>.<gateway>.memstats.txt, then its live
// heap (after a collection) and goroutines to <prefix>.<gateway>.{heap,goroutine}.pprof, when
// -profile is set; plain Caddy's too, to compare what each stream holds.
func (h *harness) liveProfiles(ctx context.Context, prefix string, g *gateway) {
	if h.cfg.ProfileDir == "" || g.admin == "" {
		return
	}
	for _, p := range []struct{ query, file string }{
		{"heap?debug=1", "memstats.txt"}, {"heap?gc=1", "heap.pprof"}, {"goroutine", "goroutine.pprof"},
	} {
		name := fmt.Sprintf("%s.%s.%s", prefix, strings.ReplaceAll(g.name, "×", "x"), p.file)
		path := filepath.Join(h.cfg.ProfileDir, name)
		err := fetchProfile(ctx, g.admin+"/debug/pprof/"+p.query, path)
		if err == nil && strings.HasSuffix(name, ".txt") {
			err = keepMemStats(path)
		}
		if err != nil {
			h.logf("profile %s: %v", name, err)
		}
	}
}

// keepMemStats cuts the text heap profile at path down to its end, the runtime's memory
// statistics.
func keepMemStats(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if i := bytes.Index(b, []byte("# runtime.MemStats")); i >= 0 {
		b = b[i:]
	}
	return os.WriteFile(path, b, 0o644)
}

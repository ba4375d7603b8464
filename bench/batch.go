package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// The batch scenario (docs/batches.md, Performance): a 50,000-line file (29.3 MB; -batch-lines
// and -batch-line-bytes change it) through a
// model server of batchSlots slots, each call batchLatency long: lines/s against the slots'
// capacity, the gateway's resident memory over idle during upload, run and download, and an
// interactive call's p99 while the batch runs against the same call unloaded.
const (
	ScenarioBatch = "batch"
	batchSlots    = 8
	batchLatency  = 20 * time.Millisecond
	// batchLineFrame is a line's bytes besides its prompt's padding (with 5-digit line numbers).
	batchLineFrame = 146
)

// slotted admits `slots` calls at once to next; the rest wait inside, first come first
// served, as a model server's own queue does (this branch's example model server has no
// slots option of its own).
func slotted(slots int, next http.Handler) http.Handler {
	sem := make(chan struct{}, slots)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case sem <- struct{}{}:
		case <-r.Context().Done():
			return
		}
		defer func() { <-sem }()
		next.ServeHTTP(w, r)
	})
}

// batch runs the scenario against a gateway and a slotted model server of its own.
func (h *harness) batch(ctx context.Context) ([]Row, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: slotted(batchSlots, modelserver.New(modelserver.Config{Latency: batchLatency})), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	extra := fmt.Sprintf("\t\tbatches /v1 {\n\t\t\tmax_file_size 1GiB\n\t\t\tmax_requests 1000000\n\t\t}\n\t\tasync {\n\t\t\tconcurrency %d\n\t\t}\n", batchSlots)
	g, err := h.startGateway(ctx, "batch", func(int) string { return mulliganSite(l.Addr().String(), h.badgerDir("batch"), extra) })
	if err != nil {
		return nil, err
	}
	defer g.stop()
	m := &batchRun{h: h, g: g}
	if err := m.run(ctx); err != nil {
		return nil, err
	}
	return []Row{m.row()}, nil
}

// batchRun is one measurement of the batch scenario.
type batchRun struct {
	h                          *harness
	g                          *gateway
	idle                       int64
	upload, running, download  int64            // peak RSS over idle in each phase
	peak, peakAnon             int64            // peak RSS and peak anonymous RSS (heap, stacks), absolute, over the whole scenario
	peakKinds                  map[string]int64 // the resident set at the peak, by what it maps (resident.go)
	peakProfiled               time.Time        // when peakProfile last wrote a profile
	runFor                     time.Duration
	unloaded, loaded           sample
	completed, failed, fileLen int
}

func (m *batchRun) run(ctx context.Context) error {
	m.unloaded = m.interactive(ctx, nil)
	m.idle, _ = m.g.rssBytes()
	var fileID string
	m.upload = m.peakDuring(ctx, func() (err error) { fileID, err = m.uploadFile(ctx); return err })
	m.heapProfile(ctx, "upload")
	if fileID == "" {
		return fmt.Errorf("upload failed")
	}
	var id string
	done := make(chan struct{})
	var runErr error
	m.running = m.peakDuring(ctx, func() error {
		id, runErr = m.runBatch(ctx, fileID, done)
		return runErr
	})
	if runErr != nil {
		return runErr
	}
	m.heapProfile(ctx, "run")
	m.download = m.peakDuring(ctx, func() error { return m.downloadOutput(ctx, id) })
	m.heapProfile(ctx, "download")
	return nil
}

// heapProfile writes the gateway's heap (live objects after a GC, and every allocation since
// it started) to ProfileDir/batch.<gateway>.<phase>.{heap,allocs}.pprof, when -profile is set.
func (m *batchRun) heapProfile(ctx context.Context, phase string) {
	if m.h.cfg.ProfileDir == "" || m.g.admin == "" {
		return
	}
	for _, kind := range []string{"heap", "allocs"} {
		name := fmt.Sprintf("batch.%s.%s.%s.pprof", m.g.name, phase, kind)
		if err := fetchProfile(ctx, m.g.admin+"/debug/pprof/"+kind+"?gc=1", filepath.Join(m.h.cfg.ProfileDir, name)); err != nil {
			m.h.logf("profile %s: %v", name, err)
		}
	}
}

// peakProfile writes the gateway's heap near the scenario's peak RSS so far (as of its last
// collection, with what it has allocated since) to ProfileDir/batch.<gateway>.peak.heap.pprof,
// when -profile is set: at most once every two seconds, the last one written being the nearest
// to the peak.
func (m *batchRun) peakProfile(ctx context.Context) {
	if m.h.cfg.ProfileDir == "" || m.g.admin == "" || time.Since(m.peakProfiled) < 2*time.Second {
		return
	}
	m.peakProfiled = time.Now()
	name := fmt.Sprintf("batch.%s.peak.heap.pprof", m.g.name)
	if err := fetchProfile(ctx, m.g.admin+"/debug/pprof/heap", filepath.Join(m.h.cfg.ProfileDir, name)); err != nil {
		m.h.logf("profile %s: %v", name, err)
	}
}

// peakDuring runs fn while sampling the gateway's RSS, and returns the peak over idle.
func (m *batchRun) peakDuring(ctx context.Context, fn func() error) int64 {
	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, err := m.g.rssBytes(); err == nil && rss > peak.Load() {
				peak.Store(rss)
				if rss > m.peak { // the scenario's peak so far: what it is made of
					m.peak = rss
					if kinds, err := m.g.residentByKind(); err == nil {
						m.peakKinds = kinds
					}
					m.peakProfile(ctx)
				}
			}
			if anon, err := m.g.procStatus("RssAnon"); err == nil && anon > m.peakAnon {
				m.peakAnon = anon // this goroutine alone writes it while fn runs
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	if err := fn(); err != nil {
		m.h.logf("batch: %v", err)
	}
	close(stop)
	wg.Wait()
	m.peak = max(m.peak, peak.Load())
	return peak.Load() - m.idle
}

// uploadFile streams the generated file through a pipe: the client holds no copy either.
func (m *batchRun) uploadFile(ctx context.Context) (string, error) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		fw, _ := mw.CreateFormFile("file", "bench.jsonl")
		pad := strings.Repeat("x", max(0, m.h.cfg.BatchLineBytes-batchLineFrame))
		for i := 1; i <= m.h.cfg.BatchLines; i++ {
			n, _ := fmt.Fprintf(fw, `{"custom_id":"b-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"bench","messages":[{"role":"user","content":"line %d %s"}]}}`+"\n", i, i, pad)
			m.fileLen += n
		}
		_ = mw.WriteField("purpose", "batch")
		pw.CloseWithError(mw.Close())
	}()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.g.base+"/v1/files", pr)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := m.h.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var f struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil || resp.StatusCode != 200 {
		return "", fmt.Errorf("upload: %d %v", resp.StatusCode, err)
	}
	return f.ID, nil
}

// runBatch creates the batch, measures interactive calls while it runs, and waits for it.
func (m *batchRun) runBatch(ctx context.Context, fileID string, done chan struct{}) (string, error) {
	body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, fileID)
	resp, out, err := send(ctx, m.h.client, http.MethodPost, m.g.base+"/v1/batches", []byte(body))
	if err != nil || resp.StatusCode != 200 {
		return "", fmt.Errorf("create: %v %s", err, out)
	}
	var b batchState
	_ = json.Unmarshal(out, &b)
	var wg sync.WaitGroup
	wg.Go(func() { m.loaded = m.interactive(ctx, done) })
	var started time.Time
	for !b.final() && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		if _, out, err = send(ctx, m.h.client, http.MethodGet, m.g.base+"/v1/batches/"+b.ID, nil); err != nil {
			break
		}
		_ = json.Unmarshal(out, &b)
		if started.IsZero() && b.RequestCounts.Completed > 0 {
			started = time.Now()
		}
	}
	m.runFor = time.Since(started)
	close(done)
	wg.Wait()
	m.completed, m.failed = b.RequestCounts.Completed, b.RequestCounts.Failed
	return b.ID, err
}

type batchState struct {
	ID            string                                 `json:"id"`
	Status        string                                 `json:"status"`
	RequestCounts struct{ Total, Completed, Failed int } `json:"request_counts"`
}

func (b batchState) final() bool {
	return b.Status == "completed" || b.Status == "failed" || b.Status == "cancelled" || b.Status == "expired"
}

// interactive sends one sync chat call every 50ms: 100 calls, or until done closes.
func (m *batchRun) interactive(ctx context.Context, done chan struct{}) sample {
	var s sample
	t0 := time.Now()
	for i := 0; (done != nil || i < 100) && ctx.Err() == nil; i++ {
		if done != nil {
			select {
			case <-done:
				s.elapsed = time.Since(t0)
				return s
			default:
			}
		}
		c0 := time.Now()
		resp, body, err := send(ctx, m.h.client, http.MethodPost, m.g.base+chatPath, chatBody(fmt.Sprint("interactive ", i)))
		if err == nil {
			err = expectStatus(resp, body, http.StatusOK)
		}
		s.record(time.Since(c0), err)
		time.Sleep(50 * time.Millisecond)
	}
	s.elapsed = time.Since(t0)
	return s
}

func (m *batchRun) downloadOutput(ctx context.Context, id string) error {
	out := "file-" + strings.TrimPrefix(id, "batch_") + "-output"
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, m.g.base+"/v1/files/"+out+"/content", nil)
	resp, err := m.h.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

func (m *batchRun) row() Row {
	capacity := float64(batchSlots) / batchLatency.Seconds()
	rate := float64(m.completed+m.failed) / m.runFor.Seconds()
	note := fmt.Sprintf("%d lines (%.1f MB), %d slots x %s = %.0f lines/s capacity: %.0f lines/s (%.0f%%); RSS over idle: upload %s, run %s, download %s (peak %s, of it anonymous %s; idle %s; at the peak: %s); interactive p99 %s unloaded, %s during the batch (%.1fx)",
		m.h.cfg.BatchLines, float64(m.fileLen)/1e6, batchSlots, batchLatency, capacity, rate, 100*rate/capacity,
		mib(m.upload), mib(m.running), mib(m.download), mib(m.peak), mib(m.peakAnon), mib(m.idle), formatKinds(m.peakKinds), m.unloaded.percentile(99), m.loaded.percentile(99),
		float64(m.loaded.percentile(99))/float64(max(m.unloaded.percentile(99), 1)))
	m.h.logf("batch: %s", note)
	return Row{Scenario: fmt.Sprintf("batch (%dk lines)", m.h.cfg.BatchLines/1000), Mulligan: []*Result{resultOf(m.loaded)}, Note: note}
}

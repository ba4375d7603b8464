package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// lineCounter is the model server behind a counter of executions per prompt and of the most
// calls in flight at once, to prove each batch line ran once and who ran them.
type lineCounter struct {
	mu       sync.Mutex
	runs     map[string]int
	inFlight atomic.Int64
	peak     atomic.Int64
}

func startLineCounter(t *testing.T, cfg modelserver.Config) (*lineCounter, string) {
	c := &lineCounter{runs: map[string]int{}}
	model := modelserver.New(cfg)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		_ = json.Unmarshal(body, &req)
		if len(req.Messages) > 0 {
			c.mu.Lock()
			c.runs[req.Messages[0].Content]++
			c.mu.Unlock()
		}
		n := c.inFlight.Add(1)
		defer c.inFlight.Add(-1)
		for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
		}
		model.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return c, s.URL
}

// startBatch uploads n lines ("line <i>") and creates a batch of them on p; it returns its id.
func (p *gatewayProcess) startBatch(t *testing.T, n int) string {
	t.Helper()
	var file bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&file, `{"custom_id":"c-%d","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"line %d"}]}}`+"\n", i, i)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write(file.Bytes())
	_ = mw.WriteField("purpose", "batch")
	_ = mw.Close()
	resp, err := http.Post(p.base+"/v1/files", mw.FormDataContentType(), &body)
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ ID string }
	_ = json.NewDecoder(resp.Body).Decode(&f)
	resp.Body.Close()
	r, b, err := p.send("POST", "/v1/batches", "", fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, f.ID))
	var batch struct{ ID string }
	if err != nil || r.StatusCode != 200 || json.Unmarshal(b, &batch) != nil {
		t.Fatalf("create batch: %v %v %s", err, r, b)
	}
	return batch.ID
}

// sidecarBatch is the part of a batch object these tests read.
type sidecarBatch struct {
	Status        string
	OutputFileID  *string                                `json:"output_file_id"`
	RequestCounts struct{ Total, Completed, Failed int } `json:"request_counts"`
}

func (p *gatewayProcess) batch(id string) (sidecarBatch, error) {
	var b sidecarBatch
	r, body, err := p.send("GET", "/v1/batches/"+id, "", "")
	if err == nil && r.StatusCode != 200 {
		err = fmt.Errorf("%d %s", r.StatusCode, body)
	}
	if err == nil {
		err = json.Unmarshal(body, &b)
	}
	return b, err
}

// awaitBatchDone polls batch id on p until it is completed, and checks its output: every
// custom_id once, each answering its own line.
func (p *gatewayProcess) awaitBatchDone(t *testing.T, id string, n int) {
	t.Helper()
	var b sidecarBatch
	testkit.WaitFor(t, 90*time.Second, "batch "+id+" completed", func() bool {
		var err error
		b, err = p.batch(id)
		return err == nil && b.Status == "completed"
	})
	if b.RequestCounts.Total != n || b.RequestCounts.Completed != n || b.OutputFileID == nil {
		t.Fatalf("batch %+v, want all %d completed", b, n)
	}
	_, out, err := p.sendWithin(30*time.Second, "GET", "/v1/files/"+*b.OutputFileID+"/content", "", "")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var l struct {
			CustomID string `json:"custom_id"`
			Response struct {
				Body json.RawMessage `json:"body"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil || seen[l.CustomID] {
			t.Fatalf("output line %q (%v, seen before: %v)", line, err, seen[l.CustomID])
		}
		seen[l.CustomID] = true
		if want := "line " + strings.TrimPrefix(l.CustomID, "c-"); !strings.Contains(string(l.Response.Body), want+`"`) {
			t.Fatalf("%s answered %s, not its own line", l.CustomID, l.Response.Body)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d custom_ids in the output, want %d", len(seen), n)
	}
}

// reruns counts the lines the upstream ran more than once, failing on any that never ran.
func (c *lineCounter) reruns(t *testing.T, n int) int {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	again := 0
	for i := 1; i <= n; i++ {
		switch runs := c.runs[fmt.Sprint("line ", i)]; {
		case runs == 0:
			t.Fatalf("line %d never reached the upstream", i)
		case runs > 1:
			again++
		}
	}
	return again
}

func TestKilledGatewayFinishesItsBatchRunningEachFinishedLineOnce(t *testing.T) {
	t.Parallel()
	const n = 300
	lines, upstream := startLineCounter(t, modelserver.Config{Latency: 20 * time.Millisecond})
	p := newGatewayProcess(t, upstream, "batches /v1\n async {\n concurrency 4\n }")
	p.start()
	id := p.startBatch(t, n)
	testkit.WaitFor(t, 15*time.Second, "some lines ran", func() bool {
		b, err := p.batch(id)
		return err == nil && b.RequestCounts.Completed >= 40
	})
	p.kill()
	before, _ := func() (int, error) { lines.mu.Lock(); defer lines.mu.Unlock(); return len(lines.runs), nil }()
	p.start()
	p.awaitBatchDone(t, id, n)
	again := lines.reruns(t, n)
	t.Logf("killed with %d lines reached; after the restart all %d completed, %d ran twice", before, n, again)
	if again > 4 {
		t.Fatalf("%d lines ran twice, more than could have been running at the kill (concurrency 4)", again)
	}
}

func TestReplicasShareOneBatch(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Database(t)
	const n = 200
	lines, upstream := startLineCounter(t, modelserver.Config{Latency: 30 * time.Millisecond})
	rs := startReplicas(t, 3, upstream, dsn, "batches /v1\n async {\n concurrency 2\n }")
	id := rs[0].startBatch(t, n)
	rs[1].awaitBatchDone(t, id, n)
	if again := lines.reruns(t, n); again != 0 {
		t.Fatalf("%d lines ran twice", again)
	}
	if peak := lines.peak.Load(); peak <= 2 {
		t.Fatalf("at most %d lines ran at once: one replica (concurrency 2) ran the whole batch", peak)
	}
	t.Logf("%d lines, each run once; up to %d at once across the three replicas", n, lines.peak.Load())

	// Summed across the replicas (docs/operating.md), the batch is created once and finished
	// once. Every replica's batch worker has seen it leave once its gauge of batches in
	// progress is back to 0.
	testkit.WaitFor(t, 10*time.Second, "every replica's worker past the batch", func() bool {
		for _, r := range rs {
			if r.metric(t, `mulligan_batches{status="in_progress"}`) != 0 {
				return false
			}
		}
		return true
	})
	var created, finished float64
	for _, r := range rs {
		created += r.metric(t, "mulligan_batches_created_total")
		finished += r.metric(t, `mulligan_batches_finished_total{status="completed"}`)
	}
	if created != 1 || finished != 1 {
		t.Fatalf("summed across the 3 replicas: %v batches created, %v finished; want 1 and 1", created, finished)
	}
}

// metric is the value of sample name (with its labels, as the exposition writes them) on r's
// /metrics; 0 when absent.
func (r *replica) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get(r.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

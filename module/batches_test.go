package module

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// batchUpstream wraps the model server: a line whose prompt contains "reject" is refused 400,
// and every prompt's executions are counted, to prove each line ran once.
type batchUpstream struct {
	mu    sync.Mutex
	runs  map[string]int
	block chan struct{} // when set, prompts containing "slow" wait for it
}

func newBatchUpstream() *batchUpstream { return &batchUpstream{runs: map[string]int{}} }

func (u *batchUpstream) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		_ = json.Unmarshal(body, &req)
		prompt := ""
		if len(req.Messages) > 0 {
			prompt = req.Messages[0].Content
		}
		u.mu.Lock()
		u.runs[prompt]++
		u.mu.Unlock()
		if strings.Contains(prompt, "slow") && u.block != nil {
			select {
			case <-u.block:
			case <-r.Context().Done():
				return
			}
		}
		if strings.Contains(prompt, "reject") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"rejected by the model server","type":"invalid_request_error"}}`)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (u *batchUpstream) count(prompt string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[prompt]
}

// batchInput is a JSONL file of n chat lines; lines whose number is in rejected fail upstream.
func batchInput(n int, prompt func(i int) string) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":%s}`+"\n", i, chat(prompt(i)))
	}
	return b.String()
}

// uploadFile posts content as a batch file and returns the answer.
func (g *gateway) uploadFile(t *testing.T, content, purpose string, headers ...string) result {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "input.jsonl")
	_, _ = io.WriteString(fw, content)
	_ = mw.WriteField("purpose", purpose)
	_ = mw.Close()
	req, _ := http.NewRequest("POST", g.base+"/v1/files", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return g.do(req)
}

// batchObject is the part of OpenAI's batch object the tests read.
type batchObject struct {
	ID           string  `json:"id"`
	Object       string  `json:"object"`
	Status       string  `json:"status"`
	OutputFileID *string `json:"output_file_id"`
	ErrorFileID  *string `json:"error_file_id"`
	Errors       *struct {
		Data []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Line    int    `json:"line"`
		} `json:"data"`
	} `json:"errors"`
	RequestCounts struct{ Total, Completed, Failed int } `json:"request_counts"`
}

func decodeBatch(t *testing.T, r result) batchObject {
	t.Helper()
	var b batchObject
	if r.err != nil || r.StatusCode != 200 || json.Unmarshal(r.body, &b) != nil || b.Object != "batch" {
		t.Fatalf("not a batch: %v %v %s", r.err, r.Response, r.body)
	}
	return b
}

// createBatch uploads input and creates a batch of it.
func (g *gateway) createBatch(t *testing.T, input, window string, headers ...string) batchObject {
	t.Helper()
	up := g.uploadFile(t, input, "batch", headers...)
	var f struct{ ID string }
	if up.StatusCode != 200 || json.Unmarshal(up.body, &f) != nil {
		t.Fatalf("upload: %v %s", up.Response, up.body)
	}
	body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":%q}`, f.ID, window)
	return decodeBatch(t, g.post("/v1/batches", "", body, headers...))
}

// awaitBatch polls batch id until it is final.
func (g *gateway) awaitBatch(t *testing.T, id string, headers ...string) batchObject {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b := decodeBatch(t, g.get("/v1/batches/"+id, headers...))
		switch b.Status {
		case "completed", "failed", "expired", "cancelled":
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s still %s: %+v", id, b.Status, b.RequestCounts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outputLines reads a batch file's lines by custom_id.
func (g *gateway) outputLines(t *testing.T, fileID *string, headers ...string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	if fileID == nil {
		return out
	}
	r := g.get("/v1/files/"+*fileID+"/content", headers...)
	if r.StatusCode != 200 {
		t.Fatalf("content of %s: %d %s", *fileID, r.StatusCode, r.body)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(r.body)), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("output line %q: %v", line, err)
		}
		id := l["custom_id"].(string)
		if _, dup := out[id]; dup {
			t.Fatalf("custom_id %s twice in %s", id, *fileID)
		}
		out[id] = l
	}
	return out
}

const batchesBlock = "batches /v1\n"

func TestBatchRunsEveryLineOnceWithUpstreamRejectionsInTheErrorFile(t *testing.T) {
	up := newBatchUpstream()
	g := startGatewayWith(t, gatewaySetup{wrap: up.wrap, mulligan: batchesBlock})
	prompt := func(i int) string {
		if i%5 == 0 {
			return fmt.Sprintf("reject %d", i)
		}
		return fmt.Sprintf("line %d", i)
	}
	const n = 40
	b := g.createBatch(t, batchInput(n, prompt), "24h", "Authorization", "Bearer a")
	if b.Status != "validating" {
		t.Fatalf("a new batch is %s, want validating", b.Status)
	}
	b = g.awaitBatch(t, b.ID, "Authorization", "Bearer a")
	if b.Status != "completed" || b.RequestCounts.Total != n || b.RequestCounts.Completed != 32 || b.RequestCounts.Failed != 8 {
		t.Fatalf("batch ended %s with %+v, want completed 32/8 of 40", b.Status, b.RequestCounts)
	}
	ok := g.outputLines(t, b.OutputFileID, "Authorization", "Bearer a")
	bad := g.outputLines(t, b.ErrorFileID, "Authorization", "Bearer a")
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("req-%d", i)
		line, inOK := ok[id]
		if eline, inBad := bad[id]; inBad == inOK {
			t.Fatalf("%s in output %v and in errors %v", id, inOK, inBad)
		} else if inBad {
			line = eline
		}
		status := line["response"].(map[string]any)["status_code"].(float64)
		if want := map[bool]float64{true: 200, false: 400}[i%5 != 0]; status != want {
			t.Fatalf("%s answered %v, want %v: %v", id, status, want, line)
		}
		if runs := up.count(prompt(i)); runs != 1 {
			t.Fatalf("line %d ran %d times upstream, want once", i, runs)
		}
	}
}

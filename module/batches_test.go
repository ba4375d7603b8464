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

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// batchUpstream wraps the model server: a line whose prompt contains "reject" is refused 400,
// and every prompt's executions are counted, to prove each line ran once.
type batchUpstream struct {
	mu    sync.Mutex
	runs  map[string]int
	block chan struct{} // when set, prompts containing "slow" wait for it
	slow  time.Duration // when set, prompts containing "slow" take this long
	seen  http.Header   // the headers of the last request
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
		u.seen = r.Header.Clone()
		u.mu.Unlock()
		if strings.Contains(prompt, "slow") && u.slow > 0 {
			select {
			case <-time.After(u.slow):
			case <-r.Context().Done():
				return
			}
		}
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
	return g.uploadParts(t, func(mw *multipart.Writer) {
		fw, _ := mw.CreateFormFile("file", "input.jsonl")
		_, _ = io.WriteString(fw, content)
		_ = mw.WriteField("purpose", purpose)
	}, headers...)
}

// uploadParts posts a multipart upload built by write and returns the answer.
func (g *gateway) uploadParts(t *testing.T, write func(mw *multipart.Writer), headers ...string) result {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	write(mw)
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
	var b batchObject
	testkit.WaitFor(t, 60*time.Second, "batch "+id+" ended", func() bool {
		b = decodeBatch(t, g.get("/v1/batches/"+id, headers...))
		switch b.Status {
		case "completed", "failed", "expired", "cancelled":
			return true
		}
		return false
	})
	return b
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
	t.Parallel()
	up := newBatchUpstream()
	g := startHandlerWith(t, gatewaySetup{wrap: up.wrap, mulligan: batchesBlock})
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

// expectOpenAIError checks an answer of the Files and Batches API: the gateway's error schema
// with OpenAI's type, and a message saying what is wrong.
func expectOpenAIError(t *testing.T, r result, status int, code apierr.Code, message string) {
	t.Helper()
	expectError(t, r, status, code, false)
	var e struct {
		Error struct{ Type, Message string } `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	if e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, message) {
		t.Fatalf("error %s, want type invalid_request_error and a message saying %q", r.body, message)
	}
}

func TestFilesAndBatchesOverTheirLimitsAreRefused(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "batches /v1 {\n max_file_size 1KiB\n max_requests 3\n}\n")
	who := []string{"Authorization", "Bearer a"} // a caller without credentials lists nothing
	expectOpenAIError(t, g.uploadFile(t, strings.Repeat("x", 2048), "batch", who...), http.StatusRequestEntityTooLarge, apierr.CodeRequestTooLarge, "max_file_size")
	expectOpenAIError(t, g.uploadFile(t, batchInput(1, func(int) string { return "x" }), "fine-tune", who...), http.StatusBadRequest, apierr.CodeInvalidRequest, `purpose "batch"`)
	up := g.uploadFile(t, batchInput(4, func(int) string { return "x" }), "batch", who...)
	var f struct{ ID string }
	_ = json.Unmarshal(up.body, &f)
	body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, f.ID)
	expectOpenAIError(t, g.post("/v1/batches", "", body, who...), http.StatusBadRequest, apierr.CodeInvalidRequest, "max_requests")
	// The window's value, quoted: a file id, random base32, may hold "24h" itself (seen once).
	expectOpenAIError(t, g.post("/v1/batches", "", strings.Replace(body, `"completion_window":"24h"`, `"completion_window":"2 days"`, 1), who...),
		http.StatusBadRequest, apierr.CodeInvalidRequest, "completion_window")
	expectOpenAIError(t, g.get("/v1/batches/batch_missing", who...), http.StatusNotFound, apierr.CodeBatchNotFound, "batch_missing")
	if list := g.get("/v1/files", who...); list.StatusCode != 200 || !strings.Contains(string(list.body), `"object":"list"`) || strings.Count(string(list.body), `"object":"file"`) != 1 {
		t.Fatalf("files list after one accepted upload: %s", list.body)
	}
}

// An upload is bounded around its file: its name, its parts, and what its body holds besides
// the file; each refusal names what is over, and nothing is stored.
func TestUploadsAreBoundedAroundTheFile(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "batches /v1 {\n max_file_size 1KiB\n}\n")
	who := []string{"Authorization", "Bearer a"} // a caller without credentials lists nothing
	file := func(name string) func(mw *multipart.Writer) {
		return func(mw *multipart.Writer) {
			fw, _ := mw.CreateFormFile("file", name)
			_, _ = io.WriteString(fw, batchInput(1, func(int) string { return "x" }))
			_ = mw.WriteField("purpose", "batch")
		}
	}
	expectOpenAIError(t, g.uploadParts(t, file(strings.Repeat("n", 300)+".jsonl"), who...), http.StatusBadRequest, apierr.CodeInvalidRequest, "name is over 255 bytes")
	expectOpenAIError(t, g.uploadParts(t, func(mw *multipart.Writer) {
		for i := range 20 {
			_ = mw.WriteField(fmt.Sprint("extra", i), "x")
		}
		file("input.jsonl")(mw)
	}, who...), http.StatusBadRequest, apierr.CodeInvalidRequest, "more than 16 parts")
	expectOpenAIError(t, g.uploadParts(t, func(mw *multipart.Writer) {
		_ = mw.WriteField("padding", strings.Repeat("p", 100<<10))
		file("input.jsonl")(mw)
	}, who...), http.StatusRequestEntityTooLarge, apierr.CodeRequestTooLarge, "max_file_size")
	if list := g.get("/v1/files", who...); list.StatusCode != 200 || strings.Contains(string(list.body), `"object":"file"`) {
		t.Fatalf("files after refused uploads: %s", list.body)
	}
	if ok := g.uploadParts(t, file(strings.Repeat("n", 249)+".jsonl"), who...); ok.StatusCode != 200 {
		t.Fatalf("an upload within every bound: %d %s", ok.StatusCode, ok.body)
	}
}

func TestBatchWebhookIsSignedAndLinesSendNoOperationEvents(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, secretA, nil)
	g := startHandler(t, modelserver.Config{}, batchesBlock+webhooksBlock(rc.srv.URL+"/hook", "", secretA))
	b := g.createBatch(t, batchInput(5, func(i int) string { return fmt.Sprint("hooked ", i) }), "24h", "Callback-Url", rc.srv.URL+"/hook")
	var f struct{ ID string }
	_ = json.Unmarshal(g.uploadFile(t, batchInput(1, func(int) string { return "x" }), "batch").body, &f)
	refused := g.post("/v1/batches", "", fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, f.ID),
		"Callback-Url", "https://elsewhere.example.com/hook")
	expectError(t, refused, http.StatusUnprocessableEntity, apierr.CodeCallbackNotAllow, false)
	b = g.awaitBatch(t, b.ID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() >= 1", func() bool { return rc.delivered() >= 1 })
	if ops := g.get("/v1/operations"); strings.Contains(string(ops.body), "op_batch_") {
		t.Fatalf("line operations listed among the caller's operations: %s", ops.body)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.events) != 1 || rc.badSigs != 0 {
		t.Fatalf("%d events (%d bad signatures), want the batch's one: %v", len(rc.events), rc.badSigs, rc.events)
	}
	ev := rc.events[0]
	batch, _ := ev["batch"].(map[string]any)
	if ev["event_type"] != "batch.completed" || batch["id"] != b.ID || batch["status"] != "completed" || ev["operation"] != nil {
		t.Fatalf("event %v", ev)
	}
}

func TestBatchPastItsCompletionWindowExpiresTheLinesNotStarted(t *testing.T) {
	t.Parallel()
	up := newBatchUpstream()
	up.block = make(chan struct{})
	g := startHandlerWith(t, gatewaySetup{wrap: up.wrap, mulligan: batchesBlock + "async {\n concurrency 1\n}\n"})
	const n = 6
	b := g.createBatch(t, batchInput(n, func(i int) string { return fmt.Sprint("slow ", i) }), "1s")
	// Line 1 holds the only seat until released; the window passes meanwhile.
	testkit.WaitFor(t, 5*time.Second, `up.count("slow 1") == 1`, func() bool { return up.count("slow 1") == 1 })
	testkit.WaitFor(t, 5*time.Second, "every line but the first failed", func() bool {
		return decodeBatch(t, g.get("/v1/batches/"+b.ID)).RequestCounts.Failed == n-1
	})
	close(up.block)
	b = g.awaitBatch(t, b.ID)
	if b.Status != "expired" || b.RequestCounts.Completed != 1 || b.RequestCounts.Failed != n-1 {
		t.Fatalf("batch ended %s %+v, want expired with line 1 completed", b.Status, b.RequestCounts)
	}
	ok, bad := g.outputLines(t, b.OutputFileID), g.outputLines(t, b.ErrorFileID)
	if _, done := ok["req-1"]; !done || len(ok) != 1 || len(bad) != n-1 {
		t.Fatalf("output %v, errors %v", ok, bad)
	}
	for id, l := range bad {
		if e, _ := l["error"].(map[string]any); e["code"] != "batch_expired" || l["response"] != nil {
			t.Fatalf("%s: %v, want error batch_expired", id, l)
		}
	}
	for i := 2; i <= n; i++ {
		if c := up.count(fmt.Sprint("slow ", i)); c != 0 {
			t.Fatalf("expired line %d reached the upstream %d times", i, c)
		}
	}
}

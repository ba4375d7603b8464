package modelserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

const chatBody = `{"model":"gpt-test","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello   world"}]}`

func newServer(t *testing.T, cfg modelserver.Config) (*modelserver.Server, *httptest.Server) {
	t.Helper()
	ms := modelserver.New(cfg)
	ts := httptest.NewServer(ms)
	t.Cleanup(ts.Close)
	return ms, ts
}

// do sends method path with body and headers and returns the response with
// its body read.
func do(t *testing.T, client *http.Client, method, url, body string, headers map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return resp, b
}

func post(t *testing.T, ts *httptest.Server, path, body string, headers map[string]string) (*http.Response, []byte) {
	t.Helper()
	return do(t, ts.Client(), http.MethodPost, ts.URL+path, body, headers)
}

func stats(t *testing.T, ts *httptest.Server) modelserver.Stats {
	t.Helper()
	resp, b := do(t, ts.Client(), http.MethodGet, ts.URL+"/stats", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /stats: %d %s", resp.StatusCode, b)
	}
	var st modelserver.Stats
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("GET /stats: %v in %s", err, b)
	}
	return st
}

// waitStats polls /stats until cond holds, for at most 2s.
func waitStats(t *testing.T, ts *httptest.Server, what string, cond func(modelserver.Stats) bool) modelserver.Stats {
	t.Helper()
	var st modelserver.Stats
	testkit.WaitFor(t, 2*time.Second, "stats showing "+what, func() bool {
		st = stats(t, ts)
		return cond(st)
	})
	return st
}

func wantCounts(t *testing.T, st modelserver.Stats, received, completed, abandoned, failed, inFlight int64) {
	t.Helper()
	if st.Received != received || st.Completed != completed || st.Abandoned != abandoned || st.Failed != failed || st.InFlight != inFlight {
		t.Fatalf("stats = received %d completed %d abandoned %d failed %d in_flight %d; want %d %d %d %d %d",
			st.Received, st.Completed, st.Abandoned, st.Failed, st.InFlight,
			received, completed, abandoned, failed, inFlight)
	}
}

type chatResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Padding string `json:"padding"`
}

func decodeChat(t *testing.T, b []byte) chatResponse {
	t.Helper()
	var cr chatResponse
	if err := json.Unmarshal(b, &cr); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return cr
}

type errorResponse struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, b []byte) errorResponse {
	t.Helper()
	var er errorResponse
	if err := json.Unmarshal(b, &er); err != nil || er.Error.Message == "" || er.Error.Type == "" {
		t.Fatalf("not an OpenAI error body (%v): %s", err, b)
	}
	return er
}

func TestChatCompletion(t *testing.T) {
	ms, ts := newServer(t, modelserver.Config{})
	resp, b := post(t, ts, "/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	if got := resp.Header.Get(modelserver.HeaderExecutionID); got != "1" {
		t.Errorf("X-Execution-Id = %q, want 1", got)
	}
	cr := decodeChat(t, b)
	if cr.ID != "chatcmpl-1" || cr.Object != "chat.completion" || cr.Model != "gpt-test" || cr.Created == 0 {
		t.Errorf("envelope = %+v", cr)
	}
	if len(cr.Choices) != 1 || cr.Choices[0].Message.Role != "assistant" ||
		cr.Choices[0].Message.Content != "You said: hello world" || cr.Choices[0].FinishReason != "stop" {
		t.Errorf("choices = %+v", cr.Choices)
	}
	if u := cr.Usage; u.PromptTokens != 4 || u.CompletionTokens != 4 || u.TotalTokens != 8 {
		t.Errorf("usage = %+v", u)
	}
	st := stats(t, ts)
	wantCounts(t, st, 1, 1, 0, 0, 0)
	if st.ByPath["/v1/chat/completions"] != 1 || len(st.ByKey) != 0 {
		t.Errorf("by_path = %v, by_key = %v", st.ByPath, st.ByKey)
	}
	wantCounts(t, ms.Stats(), 1, 1, 0, 0, 0)

	// Default model, content given as parts.
	_, b = post(t, ts, "/v1/chat/completions",
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, nil)
	cr = decodeChat(t, b)
	if cr.Model != modelserver.DefaultModel || cr.Choices[0].Message.Content != "You said: hi" {
		t.Errorf("got model %q content %q", cr.Model, cr.Choices[0].Message.Content)
	}
}

func TestStatsJSONShape(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	resp, b := do(t, ts.Client(), http.MethodGet, ts.URL+"/stats", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"received", "completed", "abandoned", "failed", "in_flight", "by_key", "by_path",
		"slots", "running", "queued", "max_in_flight", "max_running", "max_queued", "busy_slot_ns", "queued_ns",
		"seated", "queue_wait_total_ns", "queue_wait_max_ns", "window_ns"} {
		if _, ok := m[k]; !ok {
			t.Errorf("/stats lacks %q: %s", k, b)
		}
	}
	if string(m["by_key"]) != "{}" {
		t.Errorf("by_key = %s, want {}", m["by_key"])
	}
}

func TestExecutionIDsDistinguishReExecution(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	r1, b1 := post(t, ts, "/v1/chat/completions", chatBody, nil)
	r2, b2 := post(t, ts, "/v1/chat/completions", chatBody, nil)
	c1, c2 := decodeChat(t, b1), decodeChat(t, b2)
	if c1.ID == c2.ID || r1.Header.Get("X-Execution-Id") == r2.Header.Get("X-Execution-Id") {
		t.Fatalf("identical requests got the same execution: %s / %s", c1.ID, c2.ID)
	}
	if c1.ID != "chatcmpl-"+r1.Header.Get("X-Execution-Id") {
		t.Errorf("id %q does not match header %q", c1.ID, r1.Header.Get("X-Execution-Id"))
	}
	if c1.Choices[0].Message.Content != c2.Choices[0].Message.Content {
		t.Errorf("content is not deterministic: %q vs %q", c1.Choices[0].Message.Content, c2.Choices[0].Message.Content)
	}
	wantCounts(t, stats(t, ts), 2, 2, 0, 0, 0)
}

func TestMockStatus(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	resp, b := post(t, ts, "/v1/chat/completions", chatBody, map[string]string{"X-Mock-Status": "503"})
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	if er := decodeError(t, b); er.Error.Type != "server_error" {
		t.Errorf("error type %q", er.Error.Type)
	}
	if resp.Header.Get("X-Execution-Id") == "" {
		t.Error("no X-Execution-Id on injected failure")
	}
	wantCounts(t, stats(t, ts), 1, 1, 0, 1, 0)

	// A non-error forced status keeps the normal body.
	resp, b = post(t, ts, "/v1/chat/completions", chatBody, map[string]string{"X-Mock-Status": "201"})
	if resp.StatusCode != http.StatusCreated || decodeChat(t, b).Choices[0].Message.Content == "" {
		t.Fatalf("status %d body %s", resp.StatusCode, b)
	}
	wantCounts(t, stats(t, ts), 2, 2, 0, 1, 0)
}

func TestMockDropIsTransportError(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("X-Mock-Fail", "drop")
	client := &http.Client{Transport: &http.Transport{}} // fresh connection: no transparent retry
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got a response (%d), want a transport error", resp.StatusCode)
	}
	st := waitStats(t, ts, "the drop", func(st modelserver.Stats) bool { return st.InFlight == 0 })
	wantCounts(t, st, 1, 0, 0, 1, 0)
}

func TestClientCancelDuringLatencyIsAbandoned(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("X-Mock-Latency", "10s")
	errc := make(chan error, 1)
	go func() {
		resp, err := ts.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitStats(t, ts, "the request in flight", func(st modelserver.Stats) bool { return st.InFlight == 1 })
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("cancelled request succeeded")
	}
	st := waitStats(t, ts, "abandoned=1", func(st modelserver.Stats) bool { return st.Abandoned == 1 })
	wantCounts(t, st, 1, 0, 1, 0, 0)
}

func TestLatency(t *testing.T) {
	const latency = 150 * time.Millisecond
	_, ts := newServer(t, modelserver.Config{Latency: latency})
	start := time.Now()
	post(t, ts, "/v1/chat/completions", chatBody, nil)
	if d := time.Since(start); d < latency {
		t.Errorf("answered after %v, want >= %v", d, latency)
	}
	start = time.Now()
	post(t, ts, "/v1/chat/completions", chatBody, map[string]string{"X-Mock-Latency": "20ms"})
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Errorf("X-Mock-Latency 20ms answered after %v", d)
	}
	resp, b := post(t, ts, "/v1/chat/completions", chatBody, map[string]string{"X-Mock-Latency": "soon"})
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad X-Mock-Latency: status %d", resp.StatusCode)
	}
	decodeError(t, b)
}

type sseEvent struct {
	data string
	at   time.Time
}

// readSSE reads "data:" events until [DONE] or EOF.
func readSSE(t *testing.T, body io.Reader, first chan<- struct{}) []sseEvent {
	t.Helper()
	var events []sseEvent
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		events = append(events, sseEvent{data: data, at: time.Now()})
		if len(events) == 1 && first != nil {
			close(first)
		}
		if data == "[DONE]" {
			break
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading stream: %v", err)
	}
	return events
}

func TestStreamingChat(t *testing.T) {
	const chunkDelay = 100 * time.Millisecond
	_, ts := newServer(t, modelserver.Config{ChunkDelay: chunkDelay})
	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/chat/completions",
		strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"alpha"}]}`))
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	id := resp.Header.Get("X-Execution-Id")
	events := readSSE(t, resp.Body, nil)
	if len(events) < 4 || events[len(events)-1].data != "[DONE]" {
		t.Fatalf("want >= 3 data events then [DONE], got %d events: %v", len(events), events)
	}
	// Flushing: the first event arrives well before the end of the stream.
	if gap := events[len(events)-1].at.Sub(events[0].at); gap < chunkDelay*3/2 {
		t.Errorf("first event only %v before [DONE]; stream is not flushed per chunk", gap)
	}
	var content strings.Builder
	for i, ev := range events[:len(events)-1] {
		var c struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Model   string `json:"model"`
			Choices []struct {
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("chunk %d %q: %v", i, ev.data, err)
		}
		if c.ID != "chatcmpl-"+id || c.Object != "chat.completion.chunk" || c.Model != modelserver.DefaultModel {
			t.Errorf("chunk %d envelope: %+v", i, c)
		}
		last := i == len(events)-2
		if fr := c.Choices[0].FinishReason; (fr != nil) != last || (last && *fr != "stop") {
			t.Errorf("chunk %d finish_reason %v", i, fr)
		}
		if i == 0 && c.Choices[0].Delta.Role != "assistant" {
			t.Errorf("first chunk role %q", c.Choices[0].Delta.Role)
		}
		content.WriteString(c.Choices[0].Delta.Content)
	}
	if content.String() != "You said: alpha" {
		t.Errorf("streamed content %q", content.String())
	}
	wantCounts(t, stats(t, ts), 1, 1, 0, 0, 0)
}

func TestStreamingCancelIsAbandoned(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{ChunkDelay: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions",
		strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"a b c d"}]}`))
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first event: %q, %v", line, err)
	}
	cancel()
	st := waitStats(t, ts, "abandoned=1", func(st modelserver.Stats) bool { return st.Abandoned == 1 })
	wantCounts(t, st, 1, 0, 1, 0, 0)
}

func TestCompletions(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	resp, b := post(t, ts, "/v1/completions", `{"model":"m","prompt":"say  this"}`, nil)
	var c struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &c); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d body %s err %v", resp.StatusCode, b, err)
	}
	if c.ID != "cmpl-1" || c.Object != "text_completion" || c.Model != "m" ||
		c.Choices[0].Text != "You said: say this" || c.Choices[0].FinishReason != "stop" || c.Usage.TotalTokens != 6 {
		t.Errorf("completion = %+v", c)
	}

	resp, b = post(t, ts, "/v1/completions", `{"prompt":["x"],"stream":true}`, nil)
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("Content-Type %q", resp.Header.Get("Content-Type"))
	}
	events := readSSE(t, strings.NewReader(string(b)), nil)
	if len(events) != 4 || events[3].data != "[DONE]" || !strings.Contains(events[0].data, `"object":"text_completion"`) {
		t.Errorf("events = %v", events)
	}
}

func TestEmbeddings(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	type embResp struct {
		ID     string `json:"id"`
		Object string `json:"object"`
		Model  string `json:"model"`
		Data   []struct {
			Object    string    `json:"object"`
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
	}
	get := func(body string) embResp {
		resp, b := post(t, ts, "/v1/embeddings", body, nil)
		var e embResp
		if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d body %s err %v", resp.StatusCode, b, err)
		}
		return e
	}
	e1 := get(`{"input":["cat","dog"]}`)
	e2 := get(`{"input":"cat","model":"emb"}`)
	if e1.Object != "list" || !strings.HasPrefix(e1.ID, "embd-") || e1.Model != modelserver.DefaultModel || e2.Model != "emb" {
		t.Errorf("envelopes %+v / %+v", e1, e2)
	}
	if len(e1.Data) != 2 || e1.Data[1].Index != 1 || e1.Data[0].Object != "embedding" || len(e1.Data[0].Embedding) != 8 {
		t.Fatalf("data = %+v", e1.Data)
	}
	if fmt.Sprint(e1.Data[0].Embedding) != fmt.Sprint(e2.Data[0].Embedding) {
		t.Errorf("same input, different vectors: %v vs %v", e1.Data[0].Embedding, e2.Data[0].Embedding)
	}
	if fmt.Sprint(e1.Data[0].Embedding) == fmt.Sprint(e1.Data[1].Embedding) {
		t.Error("different inputs, same vector")
	}
	if fmt.Sprint(e2.Data[0].Embedding) != fmt.Sprint(modelserver.Embed("cat", 8)) {
		t.Error("response does not match Embed")
	}
	var norm float64
	for _, x := range e1.Data[0].Embedding {
		norm += x * x
	}
	if math.Abs(norm-1) > 1e-4 {
		t.Errorf("norm^2 = %v, want 1", norm)
	}
	if e := get(`{"input":"cat","dimensions":3}`); len(e.Data[0].Embedding) != 3 {
		t.Errorf("dimensions ignored: %v", e.Data[0].Embedding)
	}
}

func TestByKeyAndReset(t *testing.T) {
	ms, ts := newServer(t, modelserver.Config{})
	for _, key := range []string{"a", "a", "b", "", "a"} {
		h := map[string]string{}
		if key != "" {
			h["Idempotency-Key"] = key
		}
		post(t, ts, "/v1/chat/completions", chatBody, h)
	}
	post(t, ts, "/v1/embeddings", `{"input":"x"}`, map[string]string{"Idempotency-Key": "b"})
	st := stats(t, ts)
	wantCounts(t, st, 6, 6, 0, 0, 0)
	if len(st.ByKey) != 2 || st.ByKey["a"] != 3 || st.ByKey["b"] != 2 {
		t.Errorf("by_key = %v", st.ByKey)
	}
	if st.ByPath["/v1/chat/completions"] != 5 || st.ByPath["/v1/embeddings"] != 1 {
		t.Errorf("by_path = %v", st.ByPath)
	}

	resp, b := do(t, ts.Client(), http.MethodPost, ts.URL+"/stats/reset", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reset: %d %s", resp.StatusCode, b)
	}
	st = stats(t, ts)
	wantCounts(t, st, 0, 0, 0, 0, 0)
	if len(st.ByKey) != 0 || len(st.ByPath) != 0 {
		t.Errorf("after reset by_key %v by_path %v", st.ByKey, st.ByPath)
	}
	// Execution ids keep growing across resets.
	r, _ := post(t, ts, "/v1/chat/completions", chatBody, map[string]string{"Idempotency-Key": "a"})
	if r.Header.Get("X-Execution-Id") != "7" {
		t.Errorf("execution id after reset = %q, want 7", r.Header.Get("X-Execution-Id"))
	}
	st = stats(t, ts)
	wantCounts(t, st, 1, 1, 0, 0, 0)
	if st.ByKey["a"] != 1 {
		t.Errorf("by_key after reset = %v", st.ByKey)
	}

	ms.Reset()
	wantCounts(t, ms.Stats(), 0, 0, 0, 0, 0)
	if resp, _ := do(t, ts.Client(), http.MethodGet, ts.URL+"/stats/reset", "", nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /stats/reset: %d", resp.StatusCode)
	}
}

func TestErrorsAndRouting(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{Latency: time.Hour}) // errors never wait
	resp, b := post(t, ts, "/v1/chat/completions", `{"messages":`, nil)
	if resp.StatusCode != http.StatusBadRequest || decodeError(t, b).Error.Type != "invalid_request_error" {
		t.Errorf("bad JSON: %d %s", resp.StatusCode, b)
	}
	resp, b = post(t, ts, "/v1/embeddings", `[1,2]`, nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("non-object JSON: %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, ts.Client(), http.MethodGet, ts.URL+"/v1/chat/completions", "", nil)
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET model path: %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	decodeError(t, b)
	resp, b = post(t, ts, "/v1/nope", `{}`, nil)
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("unknown path: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	decodeError(t, b)
	resp, b = do(t, ts.Client(), http.MethodGet, ts.URL+"/healthz", "", nil)
	if resp.StatusCode != http.StatusOK || string(b) != "ok" {
		t.Errorf("healthz: %d %q", resp.StatusCode, b)
	}
	// The two 400s executed (and completed); 405/404 are not model requests.
	wantCounts(t, stats(t, ts), 2, 2, 0, 0, 0)
}

func TestFailRate(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{FailRate: 1, FailStatus: http.StatusTooManyRequests})
	resp, b := post(t, ts, "/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d", resp.StatusCode)
	}
	decodeError(t, b)
	// An explicit X-Mock-Status takes precedence over random injection.
	if resp, _ := post(t, ts, "/v1/chat/completions", chatBody, map[string]string{"X-Mock-Status": "200"}); resp.StatusCode != http.StatusOK {
		t.Errorf("X-Mock-Status 200 with FailRate 1: %d", resp.StatusCode)
	}
	wantCounts(t, stats(t, ts), 2, 2, 0, 1, 0)

	_, ts = newServer(t, modelserver.Config{FailRate: 0.5, Seed: 42})
	fails := 0
	for range 100 {
		resp, _ := post(t, ts, "/v1/embeddings", `{"input":"x"}`, nil)
		switch resp.StatusCode {
		case http.StatusServiceUnavailable:
			fails++
		case http.StatusOK:
		default:
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if fails < 20 || fails > 80 {
		t.Errorf("%d/100 failures at FailRate 0.5", fails)
	}
	if st := stats(t, ts); st.Failed != int64(fails) || st.Completed != 100 {
		t.Errorf("stats %+v, want failed %d completed 100", st, fails)
	}
}

func TestBodyBytesPadding(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	for _, h := range []map[string]string{
		{"X-Mock-Body-Bytes": "10000"},
		{"X-Mock-Body-Bytes": "10000", "X-Mock-Status": "500"},
	} {
		resp, b := post(t, ts, "/v1/chat/completions", chatBody, h)
		if len(b) != 10000 || resp.ContentLength != 10000 {
			t.Errorf("%v: body %d bytes, Content-Length %d; want 10000", h, len(b), resp.ContentLength)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || m["padding"] == nil {
			t.Errorf("%v: padded body is not JSON with padding: %v", h, err)
		}
	}
}

func TestManyConcurrentRequests(t *testing.T) {
	const n = 300
	_, ts := newServer(t, modelserver.Config{Latency: 100 * time.Millisecond})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()
	var (
		mu  sync.Mutex
		ids = map[string]bool{}
		wg  sync.WaitGroup
	)
	for i := range n {
		wg.Go(func() {
			resp, b := do(t, client, http.MethodPost, ts.URL+"/v1/chat/completions", chatBody,
				map[string]string{"Idempotency-Key": "k" + strconv.Itoa(i%10)})
			if resp.StatusCode != http.StatusOK {
				t.Errorf("status %d: %s", resp.StatusCode, b)
			}
			mu.Lock()
			ids[resp.Header.Get("X-Execution-Id")] = true
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(ids) != n {
		t.Errorf("%d distinct execution ids, want %d", len(ids), n)
	}
	st := stats(t, ts)
	wantCounts(t, st, n, n, 0, 0, 0)
	// The server's own gauge, not the wall clock, which a loaded machine stretches: serialised
	// waits would never have more than one request running.
	if st.MaxRunning < 10 {
		t.Errorf("at most %d of %d concurrent requests with 100ms latency ran at once: waits are serialised", st.MaxRunning, n)
	}
	for k, v := range st.ByKey {
		if v != n/10 {
			t.Errorf("by_key[%s] = %d, want %d", k, v, n/10)
		}
	}
}

// max_tokens sets the length of a generation, as on a model that runs to its limit: the answer
// has exactly that many words, usage says so and the finish reason is "length"; streamed, one
// chunk per word. A value a model server refuses is a 400, without the latency.
func TestMaxTokensSetsTheGenerationsLength(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	for _, c := range []struct {
		body string
		want string
	}{
		{`{"messages":[{"role":"user","content":"hello world"}],"max_tokens":2}`, "You said:"},
		{`{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":6}`, "You said: hi and then the"},
		{`{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"max_completion_tokens":5}`, "You said: hi and then"},
	} {
		resp, b := post(t, ts, "/v1/chat/completions", c.body, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", c.body, resp.StatusCode, b)
		}
		cr := decodeChat(t, b)
		n := len(strings.Fields(c.want))
		if cr.Choices[0].Message.Content != c.want || cr.Choices[0].FinishReason != "length" || cr.Usage.CompletionTokens != n {
			t.Errorf("%s: answered %q, finish %q, usage %+v; want %q of %d tokens, length",
				c.body, cr.Choices[0].Message.Content, cr.Choices[0].FinishReason, cr.Usage, c.want, n)
		}
	}
	resp, err := ts.Client().Post(ts.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"stream":true,"max_tokens":40,"messages":[{"role":"user","content":"alpha"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	events := readSSE(t, resp.Body, nil)
	resp.Body.Close()
	if len(events) != 41 || !strings.Contains(events[39].data, `"finish_reason":"length"`) {
		t.Errorf("streamed max_tokens 40: %d events, last chunk %s", len(events), events[len(events)-2].data)
	}
	for _, body := range []string{
		`{"messages":[],"max_tokens":0}`,
		`{"messages":[],"max_tokens":-3}`,
		`{"messages":[],"max_tokens":100000}`,
		`{"messages":[],"max_completion_tokens":4097}`,
		`{"messages":[],"max_tokens":"ten"}`,
	} {
		if resp, b := post(t, ts, "/v1/chat/completions", body, nil); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400: %s", body, resp.StatusCode, b)
		}
	}
	resp, b := post(t, ts, "/v1/completions", `{"prompt":"say","max_tokens":3}`, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"text":"You said: say"`) || !strings.Contains(string(b), `"completion_tokens":3`) {
		t.Errorf("completions max_tokens 3: %d %s", resp.StatusCode, b)
	}
}

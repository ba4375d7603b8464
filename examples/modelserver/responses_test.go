package modelserver_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

type responseJSON struct {
	ID         string `json:"id"`
	Object     string `json:"object"`
	Status     string `json:"status"`
	Background bool   `json:"background"`
	Model      string `json:"model"`
	Output     []struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func TestResponsesWhole(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	resp, b := post(t, ts, "/v1/responses", `{"model":"m","input":"alpha beta"}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var r responseJSON
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get(modelserver.HeaderExecutionID)
	if r.ID != "resp_ms"+id || r.Object != "response" || r.Status != "completed" || r.Model != "m" || r.Background {
		t.Errorf("envelope: %+v", r)
	}
	if len(r.Output) != 1 || r.Output[0].Role != "assistant" || r.Output[0].Content[0].Type != "output_text" ||
		r.Output[0].Content[0].Text != "You said: alpha beta" {
		t.Errorf("output: %+v", r.Output)
	}
	if r.Usage == nil || r.Usage.InputTokens != 2 || r.Usage.OutputTokens != 4 || r.Usage.TotalTokens != 6 {
		t.Errorf("usage: %+v", r.Usage)
	}
}

func TestResponsesMessagesInput(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	_, b := post(t, ts, "/v1/responses", `{"input":[{"role":"user","content":[{"type":"input_text","text":"gamma"}]}]}`, nil)
	var r responseJSON
	if err := json.Unmarshal(b, &r); err != nil || len(r.Output) != 1 || r.Output[0].Content[0].Text != "You said: gamma" {
		t.Fatalf("%s (%v)", b, err)
	}
}

func TestResponsesStreamed(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	resp, b := post(t, ts, "/v1/responses", `{"input":"one two three","stream":true}`, nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var names []string
	var text strings.Builder
	var final responseJSON
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	name := ""
	for sc.Scan() {
		line := sc.Text()
		if n, ok := strings.CutPrefix(line, "event: "); ok {
			name = n
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string       `json:"type"`
			Seq      int          `json:"sequence_number"`
			Delta    string       `json:"delta"`
			Response responseJSON `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("%q: %v", data, err)
		}
		if ev.Type != name || ev.Seq != len(names) {
			t.Errorf("event %d: type %q under event %q, sequence_number %d", len(names), ev.Type, name, ev.Seq)
		}
		names = append(names, ev.Type)
		if ev.Type == "response.output_text.delta" {
			text.WriteString(ev.Delta)
		}
		if ev.Type == "response.completed" {
			final = ev.Response
		}
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.completed"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("events:\n got %v\nwant %v", names, want)
	}
	if text.String() != "You said: one two three" {
		t.Errorf("deltas make %q", text.String())
	}
	if final.Status != "completed" || final.Usage == nil || final.Usage.OutputTokens != 5 || len(final.Output) != 1 {
		t.Errorf("final response: %+v", final)
	}
	wantCounts(t, stats(t, ts), 1, 1, 0, 0, 0)
}

// A server without a response store refuses background mode, as such servers do.
func TestResponsesRefusesBackground(t *testing.T) {
	_, ts := newServer(t, modelserver.Config{})
	resp, b := post(t, ts, "/v1/responses", `{"input":"x","background":true}`, nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "background_unsupported") {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
}

package modelserver

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// The Responses API (POST /v1/responses), as a server without a response store answers it:
// whole, or streamed with OpenAI's event types; background mode is refused, since a background
// response needs a store to be retrieved from.

type responsesRequest struct {
	Model        string          `json:"model"`
	Input        json.RawMessage `json:"input"`
	Instructions *string         `json:"instructions"`
	Stream       bool            `json:"stream"`
	Background   bool            `json:"background"`
	Metadata     json.RawMessage `json:"metadata"`
}

// parseResponses reads a Responses request: input is a string, or a list of messages whose
// content is a string or parts ({"type":"input_text","text":...}); the last user message is
// echoed.
func parseResponses(body []byte, req *modelRequest) error {
	var rr responsesRequest
	if err := decode(body, &rr); err != nil {
		return err
	}
	req.model, req.stream, req.background = rr.Model, rr.Stream, rr.Background
	if rr.Instructions != nil {
		req.instructions = *rr.Instructions
	}
	if m := bytes.TrimSpace(rr.Metadata); len(m) > 0 && m[0] == '{' {
		req.metadata = rr.Metadata
	}
	var text string
	if json.Unmarshal(rr.Input, &text) == nil {
		req.promptTokens = len(strings.Fields(text))
		req.answer = echo(text)
		return nil
	}
	var items []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	_ = json.Unmarshal(rr.Input, &items)
	var last string
	for _, it := range items {
		t := inputText(it.Content)
		req.promptTokens += len(strings.Fields(t))
		if it.Role == "user" || it.Role == "" {
			last = t
		}
	}
	req.answer = echo(last)
	return nil
}

// inputText flattens a Responses message content: a string, or parts of type input_text
// (or text).
func inputText(raw json.RawMessage) string {
	return partsText(raw, false, "input_text", "text", "output_text")
}

// responseObject is OpenAI's response object, with the fields this server fills.
type responseObject struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	CreatedAt          int64           `json:"created_at"`
	Status             string          `json:"status"`
	Background         bool            `json:"background"`
	Error              any             `json:"error"`
	IncompleteDetails  any             `json:"incomplete_details"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Model              string          `json:"model"`
	Output             []responseItem  `json:"output"`
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Store              bool            `json:"store"`
	Temperature        float64         `json:"temperature"`
	ToolChoice         string          `json:"tool_choice"`
	Tools              []any           `json:"tools"`
	TopP               float64         `json:"top_p"`
	Truncation         string          `json:"truncation"`
	Usage              *responseUsage  `json:"usage"`
	Metadata           json.RawMessage `json:"metadata"`
}

type responseItem struct {
	ID      string         `json:"id"`
	Type    string         `json:"type"`
	Status  string         `json:"status"`
	Role    string         `json:"role"`
	Content []responsePart `json:"content"`
}

type responsePart struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type responseUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

// responseEvent is one event of a streamed response: its type (the SSE event name and the
// payload's "type") and its payload.
type responseEvent struct {
	name string
	data map[string]any
}

// responseIDs are the ids of execution n's response and its message.
func responseIDs(n int64) (resp, msg string) {
	s := strconv.FormatInt(n, 10)
	return "resp_ms" + s, "msg_ms" + s
}

// responseOf is execution n's response object: in progress (no output yet) or completed.
func (r *modelRequest) responseOf(n, created int64, done bool) responseObject {
	id, msg := responseIDs(n)
	obj := responseObject{ID: id, Object: "response", CreatedAt: created, Status: "in_progress", Model: r.model,
		Output: []responseItem{}, ParallelToolCalls: true, Temperature: 1, ToolChoice: "auto", Tools: []any{}, TopP: 1,
		Truncation: "disabled", Metadata: json.RawMessage("{}")}
	if r.instructions != "" {
		obj.Instructions = &r.instructions
	}
	if r.metadata != nil {
		obj.Metadata = r.metadata
	}
	if done {
		u := r.usage()
		obj.Status = "completed"
		obj.Output = []responseItem{{ID: msg, Type: "message", Status: "completed", Role: "assistant",
			Content: []responsePart{{Type: "output_text", Text: r.answer, Annotations: []any{}}}}}
		obj.Usage = &responseUsage{InputTokens: u.PromptTokens, InputTokensDetails: map[string]int{"cached_tokens": 0},
			OutputTokens: u.CompletionTokens, OutputTokensDetails: map[string]int{"reasoning_tokens": 0}, TotalTokens: u.TotalTokens}
	}
	return obj
}

// responseEvents is execution n's streamed response: OpenAI's events in order, one
// response.output_text.delta per word of the answer, sequence_number from 0.
func (r *modelRequest) responseEvents(n, created int64) []responseEvent {
	_, msg := responseIDs(n)
	var out []responseEvent
	add := func(name string, data map[string]any) {
		data["type"], data["sequence_number"] = name, len(out)
		out = append(out, responseEvent{name: name, data: data})
	}
	item := responseItem{ID: msg, Type: "message", Status: "in_progress", Role: "assistant", Content: []responsePart{}}
	part := responsePart{Type: "output_text", Text: "", Annotations: []any{}}
	at := func(m map[string]any) map[string]any {
		m["item_id"], m["output_index"], m["content_index"] = msg, 0, 0
		return m
	}
	add("response.created", map[string]any{"response": r.responseOf(n, created, false)})
	add("response.in_progress", map[string]any{"response": r.responseOf(n, created, false)})
	add("response.output_item.added", map[string]any{"output_index": 0, "item": item})
	add("response.content_part.added", at(map[string]any{"part": part}))
	for i, w := range strings.Fields(r.answer) {
		if i > 0 {
			w = " " + w
		}
		add("response.output_text.delta", at(map[string]any{"delta": w, "logprobs": []any{}}))
	}
	add("response.output_text.done", at(map[string]any{"text": r.answer, "logprobs": []any{}}))
	part.Text = r.answer
	add("response.content_part.done", at(map[string]any{"part": part}))
	item.Status, item.Content = "completed", []responsePart{part}
	add("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	add("response.completed", map[string]any{"response": r.responseOf(n, created, true)})
	return out
}

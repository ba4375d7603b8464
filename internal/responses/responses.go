// Package responses is what the gateway knows of OpenAI's Responses API to serve its
// background mode in front of any model server (docs/responses.md): reading a create
// request, the response object in each status, the final object a recorded answer carries,
// and the events of a stream renumbered and carrying the gateway's id.
package responses

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/mulligan-gw/mulligan/internal/sse"
)

// Kind marks an operation that is a background response (store.Operation.Kind).
const Kind = "response"

// OpenAI's statuses of a response.
const (
	Queued     = "queued"
	InProgress = "in_progress"
	Completed  = "completed"
	Failed     = "failed"
	Cancelled  = "cancelled"
	Incomplete = "incomplete"
)

// Create is what the gateway reads of a POST {prefix}/responses body.
type Create struct {
	Background bool
	Stream     bool
	// Upstream is the body sent to the model server: the client's, without background, with
	// stream forced on so that every event is recorded.
	Upstream []byte
	// Echo is the request's fields a response object repeats (model, instructions, metadata,
	// tools...), compact JSON.
	Echo []byte
}

// ErrNotObject: the body is not a JSON object.
var ErrNotObject = errors.New("the body must be a JSON object")

// FieldError is a create field of the wrong type.
type FieldError struct{ Param, Message string }

func (e *FieldError) Error() string { return e.Message }

// echoed are the request fields the response object repeats, as OpenAI's does.
var echoed = []string{"model", "instructions", "metadata", "max_output_tokens", "max_tool_calls", "temperature",
	"top_p", "top_logprobs", "tools", "tool_choice", "text", "reasoning", "previous_response_id", "truncation",
	"parallel_tool_calls", "user", "store", "service_tier", "prompt", "prompt_cache_key", "safety_identifier"}

// ParseCreate reads a create body. Background and Stream are read strictly (a boolean or
// absent); the rest goes to the upstream as sent.
func ParseCreate(body []byte) (Create, error) {
	var fields map[string]json.RawMessage
	if t := bytes.TrimSpace(body); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &fields) != nil {
		return Create{}, ErrNotObject
	}
	var c Create
	for _, f := range []struct {
		name string
		dst  *bool
	}{{"background", &c.Background}, {"stream", &c.Stream}} {
		raw, ok := fields[f.name]
		if !ok || string(raw) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return Create{}, &FieldError{Param: f.name, Message: f.name + " must be a boolean."}
		}
	}
	if !c.Background {
		return c, nil
	}
	echo := map[string]json.RawMessage{}
	for _, name := range echoed {
		if raw, ok := fields[name]; ok {
			echo[name] = raw
		}
	}
	if err := checkMetadata(echo["metadata"]); err != nil {
		return Create{}, err
	}
	var err error
	if c.Echo, err = json.Marshal(echo); err != nil {
		return Create{}, ErrNotObject
	}
	if len(c.Echo) > MaxEcho {
		largest := ""
		for name, raw := range echo {
			if largest == "" || len(raw) > len(echo[largest]) {
				largest = name
			}
		}
		return Create{}, &FieldError{Param: largest, Message: "The fields a response repeats (" + largest + " the largest) come to " +
			strconv.Itoa(len(c.Echo)) + " bytes; a background response takes at most " + strconv.Itoa(MaxEcho) + "."}
	}
	delete(fields, "background")
	fields["stream"] = json.RawMessage("true")
	if c.Upstream, err = json.Marshal(fields); err != nil {
		return Create{}, ErrNotObject
	}
	return c, nil
}

// MaxEcho bounds the request fields a background response repeats (Create.Echo, compact
// JSON): they are kept in the operation's own record, read at every look at it, so they stay
// small (docs/responses.md, Limits).
const MaxEcho = 128 << 10

// OpenAI's bounds of a response's metadata: at most 16 pairs, keys of at most 64 characters,
// string values of at most 512.
const (
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// checkMetadata reads a create's metadata (nil or null: none) as OpenAI bounds it.
func checkMetadata(raw json.RawMessage) error {
	if raw == nil || string(raw) == "null" {
		return nil
	}
	var m map[string]json.RawMessage
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &m) != nil {
		return &FieldError{Param: "metadata", Message: "metadata must be an object of string values."}
	}
	if len(m) > maxMetadataPairs {
		return &FieldError{Param: "metadata", Message: "metadata has " + strconv.Itoa(len(m)) + " pairs; at most 16."}
	}
	for k, v := range m {
		var s string
		switch {
		case utf8.RuneCountInString(k) > maxMetadataKey:
			return &FieldError{Param: "metadata", Message: "A metadata key is over 64 characters."}
		case json.Unmarshal(v, &s) != nil:
			return &FieldError{Param: "metadata", Message: "metadata." + k + " must be a string."}
		case utf8.RuneCountInString(s) > maxMetadataValue:
			return &FieldError{Param: "metadata", Message: "metadata." + k + " is over 512 characters."}
		}
	}
	return nil
}

// Object is a response object, as JSON fields.
type Object map[string]any

// Base is the response object of a background response before its answer: the request's
// echoed fields, the gateway's id and creation time, and status.
func Base(id string, createdAt int64, status string, echo []byte) Object {
	o := Object{"id": id, "object": "response", "created_at": createdAt, "status": status, "background": true,
		"error": nil, "incomplete_details": nil, "output": []any{}, "usage": nil, "model": "", "instructions": nil,
		"metadata": map[string]any{}, "parallel_tool_calls": true, "tools": []any{}, "tool_choice": "auto",
		"temperature": nil, "top_p": nil, "max_output_tokens": nil, "previous_response_id": nil, "reasoning": nil,
		"text": nil, "truncation": "disabled", "user": nil}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(echo, &fields)
	for name, raw := range fields {
		if v, ok := decodeValue(raw); ok && !(name == "metadata" && v == nil) {
			o[name] = v
		}
	}
	return o
}

// DecodeObject reads an object encoded from an Object, numbers kept as written.
func DecodeObject(b []byte) (Object, bool) {
	v, ok := decodeValue(b)
	o, isObj := v.(map[string]any)
	return o, ok && isObj
}

// Own makes o the gateway's: its id and creation time, and background.
func (o Object) Own(id string, createdAt int64) Object {
	o["id"], o["created_at"], o["background"], o["object"] = id, createdAt, true, "response"
	return o
}

// Status is o's status ("" when it has none).
func (o Object) Status() string {
	s, _ := o["status"].(string)
	return s
}

// Failure sets o failed with error {code, message}.
func (o Object) Failure(code, message string) Object {
	o["status"], o["error"] = Failed, map[string]any{"code": code, "message": message}
	return o
}

// terminal are the stream events that end a response, carrying its final object.
var terminal = map[string]bool{"response.completed": true, "response.failed": true, "response.incomplete": true}

// Final is the final response object a recorded upstream answer carries: the last terminal
// event's response in an event stream, or a whole response object answered as JSON. ok is
// false when it carries none (a stream that ended without a terminal event, an error body).
func Final(contentType string, body []byte) (Object, bool) {
	if sse.IsEventStream(contentType) {
		var last Object
		var split sse.Splitter
		split.Push(body, func(block []byte) {
			typ, data := parseBlock(block)
			if !terminal[typ] {
				return
			}
			if o, ok := data["response"].(map[string]any); ok {
				last = o
			}
		})
		// An unterminated rest (no blank line after it) is not an event, as an SSE client
		// reads it, nor one the stream relays (Count).
		return last, last != nil
	}
	v, ok := decodeValue(body)
	o, isObj := v.(map[string]any)
	if !ok || !isObj || o["object"] != "response" {
		return nil, false
	}
	return o, true
}

// UpstreamError is the OpenAI error object of an upstream's error body, when it has one.
func UpstreamError(body []byte) (code, message string, ok bool) {
	var e struct {
		Error struct {
			Code    any    `json:"code"`
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil || e.Error.Message == "" {
		return "", "", false
	}
	code, _ = e.Error.Code.(string)
	if code == "" {
		code = e.Error.Type
	}
	return code, e.Error.Message, true
}

// Event is one recorded upstream event as the gateway relays it: renumbered with seq, any
// response object in it made the gateway's, written as "event: <type>" and one data line. ok
// is false for an event without a JSON object (a comment, "[DONE]") or a type: it is not
// relayed.
func Event(block []byte, seq int64, id string, createdAt int64) (out []byte, typ string, ok bool) {
	typ, data := parseBlock(block)
	if data == nil {
		return nil, "", false
	}
	if t, isStr := data["type"].(string); isStr && t != "" {
		typ = t
	}
	if typ == "" || strings.ContainsAny(typ, "\r\n") {
		return nil, "", false // a type that would break the framing is not an event to relay
	}
	data["type"], data["sequence_number"] = typ, seq
	if o, isObj := data["response"].(map[string]any); isObj {
		data["response"] = Object(o).Own(id, createdAt)
	}
	if rid, isStr := data["response_id"].(string); isStr && rid != "" {
		data["response_id"] = id
	}
	return Encode(typ, data), typ, true
}

// Encode writes one event.
func Encode(typ string, data any) []byte {
	b, _ := json.Marshal(data)
	out := make([]byte, 0, len(b)+len(typ)+16)
	out = append(out, "event: "...)
	out = append(out, typ...)
	out = append(out, "\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// TerminalEvent is the one event a response's stream replays when no whole stream of it was
// recorded (it failed or was cancelled before its answer, or the upstream answered JSON):
// its final object, as response.completed, response.failed, response.incomplete or
// response.cancelled.
func TerminalEvent(o Object, seq int64) []byte {
	typ := "response." + o.Status()
	return Encode(typ, map[string]any{"type": typ, "sequence_number": seq, "response": o})
}

// LostEvent is what a follower of an attempt that was lost (the upstream broke off, or the
// replica running it died and another took it over) gets instead of the rest of that
// attempt's events (docs/responses.md): an error event, after which the stream ends.
func LostEvent(seq int64) []byte {
	return Encode("error", map[string]any{"type": "error", "sequence_number": seq, "code": "stream_attempt_lost", "param": nil,
		"message": "The attempt this stream followed was lost; the response is being retried. Read the stream again from the start (without starting_after) or poll the response."})
}

// parseBlock reads one event: its "event:" name and its data, decoded as a JSON object
// (nil when it is not one).
func parseBlock(block []byte) (typ string, data map[string]any) {
	var payload []byte
	for line := range strings.Lines(string(block)) {
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "event:"):
			typ = strings.TrimSpace(line[len("event:"):])
		case strings.HasPrefix(line, "data:"):
			if payload != nil {
				payload = append(payload, '\n')
			}
			payload = append(payload, strings.TrimPrefix(line[len("data:"):], " ")...)
		}
	}
	v, ok := decodeValue(payload)
	if m, isObj := v.(map[string]any); ok && isObj {
		data = m
	}
	return typ, data
}

// decodeValue decodes JSON keeping numbers as written.
func decodeValue(raw []byte) (any, bool) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil || d.More() {
		return nil, false
	}
	return v, true
}

// ParseStartingAfter reads the starting_after query parameter's values: -1 when absent, else
// a sequence number from 0, written as decimal digits alone (no sign, no space), given once.
func ParseStartingAfter(values []string) (int64, error) {
	switch {
	case len(values) == 0:
		return -1, nil
	case len(values) > 1:
		return 0, errors.New("starting_after must be given once: the sequence_number of the last event received.")
	}
	v := values[0]
	if strings.HasPrefix(v, "-") && v != "-" && strings.Trim(v[1:], "0123456789") == "" {
		return 0, errors.New("starting_after must not be negative: it is the sequence_number of the last event received.")
	}
	if v == "" || strings.Trim(v, "0123456789") != "" {
		return 0, errors.New("starting_after must be a whole number: the sequence_number of the last event received.")
	}
	n, err := strconv.ParseInt(v, 10, 63)
	if err != nil {
		return 0, errors.New("starting_after is out of range: it must be a sequence number this response's stream has.")
	}
	return n, nil
}

// ParseStream reads the stream query parameter's values: true or false, given at most once
// (absent: false).
func ParseStream(values []string) (bool, error) {
	switch {
	case len(values) == 0:
		return false, nil
	case len(values) > 1:
		return false, errors.New("stream must be given once, true or false.")
	case values[0] == "true":
		return true, nil
	case values[0] == "false":
		return false, nil
	}
	return false, errors.New("stream must be true or false.")
}

// WebhookType is the event type announcing a final response of status s ("" for none).
func WebhookType(s string) string {
	switch s {
	case Completed, Failed, Cancelled, Incomplete:
		return "response." + s
	}
	return ""
}

// IsWebhookType reports whether t is one of the Responses API's webhook event types.
func IsWebhookType(t string) bool {
	return WebhookType(strings.TrimPrefix(t, "response.")) == t && t != ""
}

// EventStreamHeader sets the headers of a relayed stream.
func EventStreamHeader(h http.Header) {
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Del("Content-Length")
}

// Count is how many events a recorded stream relays: its whole events (an unterminated rest
// is not one) that Event keeps; ended reports whether one of them is a terminal event.
func Count(body []byte) (n int64, ended bool) {
	var split sse.Splitter
	split.Push(body, func(block []byte) {
		if _, typ, ok := Event(block, 0, "", 0); ok {
			n++
			ended = ended || IsTerminal(typ)
		}
	})
	return n, ended
}

// IsTerminal reports whether an event of type typ ends a response, carrying its final object.
func IsTerminal(typ string) bool { return terminal[typ] || typ == "response.cancelled" }

// QueuedEvent is the first event of every background response's stream, sequence_number 0:
// the response object as created, queued, so that a client has the response's id before the
// upstream begins (docs/responses.md).
func QueuedEvent(o Object) []byte {
	return Encode("response.queued", map[string]any{"type": "response.queued", "sequence_number": 0, "response": o})
}

// Partial folds the events of a response's stream so far into the output they have written:
// the items added, their content parts, the text deltas appended, each item as done replaces
// it. It is what a poll of a running response shows (docs/responses.md, Statuses).
type Partial struct {
	items []map[string]any
}

// Add folds one recorded event in.
func (p *Partial) Add(block []byte) {
	typ, data := parseBlock(block)
	if t, ok := data["type"].(string); ok && t != "" {
		typ = t
	}
	out, _ := indexOf(data["output_index"])
	switch typ {
	case "response.output_item.added", "response.output_item.done":
		if item, ok := data["item"].(map[string]any); ok && out >= 0 && out < 1024 {
			for len(p.items) <= out {
				p.items = append(p.items, nil)
			}
			p.items[out] = item
		}
	case "response.content_part.added", "response.content_part.done":
		if part, ok := data["part"].(map[string]any); ok {
			p.setPart(out, data["content_index"], part)
		}
	case "response.output_text.delta":
		delta, _ := data["delta"].(string)
		if part := p.part(out, data["content_index"]); part != nil {
			text, _ := part["text"].(string)
			part["text"] = text + delta
		}
	}
}

// Output is the output folded so far.
func (p *Partial) Output() []any {
	out := make([]any, 0, len(p.items))
	for _, it := range p.items {
		if it != nil {
			out = append(out, it)
		}
	}
	return out
}

func (p *Partial) setPart(out int, ci any, part map[string]any) {
	c, ok := indexOf(ci)
	if !ok || out < 0 || out >= len(p.items) || p.items[out] == nil || c >= 1024 {
		return
	}
	content, _ := p.items[out]["content"].([]any)
	for len(content) <= c {
		content = append(content, nil)
	}
	content[c] = part
	p.items[out]["content"] = content
}

func (p *Partial) part(out int, ci any) map[string]any {
	c, ok := indexOf(ci)
	if !ok || out < 0 || out >= len(p.items) || p.items[out] == nil {
		return nil
	}
	content, _ := p.items[out]["content"].([]any)
	if c >= len(content) {
		return nil
	}
	part, _ := content[c].(map[string]any)
	return part
}

// indexOf reads an index decoded as a json.Number.
func indexOf(v any) (int, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return -1, false
	}
	i, err := strconv.Atoi(n.String())
	return i, err == nil && i >= 0
}

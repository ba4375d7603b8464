package modelserver

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// kind is the model endpoint a request was sent to.
type kind int

const (
	kindChat kind = iota
	kindCompletion
	kindEmbedding
	kindResponse
)

const (
	// maxAnswerWords caps the echoed text so that a huge prompt cannot turn
	// into an hours-long stream.
	maxAnswerWords = 64
	// defaultDimensions is the embedding size when the request sets none.
	defaultDimensions = 8
	// maxDimensions caps the "dimensions" request field.
	maxDimensions = 4096
	// maxGeneratedTokens caps the "max_tokens" request field: 4,096 tokens, a long generation,
	// and with ChunkDelay a bounded stream.
	maxGeneratedTokens = 4096
)

// modelRequest is a parsed, validated model request.
type modelRequest struct {
	kind         kind
	model        string
	stream       bool
	answer       string   // chat / completion text
	finish       string   // its finish_reason: "stop", or "length" when max_tokens set its length
	promptTokens int      // whitespace-separated words in the input
	inputs       []string // embedding inputs
	dimensions   int
	// Responses API requests (responses.go)
	background   bool
	instructions string
	metadata     json.RawMessage
}

type chatRequest struct {
	Model               string        `json:"model"`
	Messages            []chatMessage `json:"messages"`
	Stream              bool          `json:"stream"`
	MaxTokens           *int          `json:"max_tokens"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type completionRequest struct {
	Model     string          `json:"model"`
	Prompt    json.RawMessage `json:"prompt"`
	Stream    bool            `json:"stream"`
	MaxTokens *int            `json:"max_tokens"`
}

type embeddingRequest struct {
	Model      string          `json:"model"`
	Input      json.RawMessage `json:"input"`
	Dimensions int             `json:"dimensions"`
}

// parseRequest decodes body for the endpoint k. Only malformed JSON and
// wrongly typed known fields are rejected; everything else has a default.
func parseRequest(k kind, body []byte) (*modelRequest, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, errors.New("We could not parse the JSON body of your request: expected a JSON object")
	}
	req := &modelRequest{kind: k, finish: "stop"}
	var maxTokens *int
	field := "max_tokens"
	switch k {
	case kindChat:
		var cr chatRequest
		if err := decode(body, &cr); err != nil {
			return nil, err
		}
		req.model, req.stream = cr.Model, cr.Stream
		var last string
		for _, m := range cr.Messages {
			text := contentText(m.Content)
			req.promptTokens += len(strings.Fields(text))
			if m.Role == "user" {
				last = text
			}
		}
		req.answer = echo(last)
		maxTokens = cmp.Or(cr.MaxCompletionTokens, cr.MaxTokens)
		if cr.MaxCompletionTokens != nil {
			field = "max_completion_tokens"
		}
	case kindCompletion:
		var cr completionRequest
		if err := decode(body, &cr); err != nil {
			return nil, err
		}
		req.model, req.stream = cr.Model, cr.Stream
		prompt := strings.Join(stringList(cr.Prompt), " ")
		req.promptTokens = len(strings.Fields(prompt))
		req.answer = echo(prompt)
		maxTokens = cr.MaxTokens
	case kindResponse:
		if err := parseResponses(body, req); err != nil {
			return nil, err
		}
	case kindEmbedding:
		var er embeddingRequest
		if err := decode(body, &er); err != nil {
			return nil, err
		}
		req.model = er.Model
		req.inputs = stringList(er.Input)
		for _, in := range req.inputs {
			req.promptTokens += len(strings.Fields(in))
		}
		req.dimensions = er.Dimensions
		if req.dimensions <= 0 {
			req.dimensions = defaultDimensions
		}
		if req.dimensions > maxDimensions {
			return nil, fmt.Errorf("dimensions must be at most %d", maxDimensions)
		}
	}
	if maxTokens != nil {
		n := *maxTokens
		if n < 1 || n > maxGeneratedTokens {
			return nil, fmt.Errorf("%s must be from 1 to %d, got %d", field, maxGeneratedTokens, n)
		}
		req.answer, req.finish = generate(req.answer, n), "length"
	}
	if req.model == "" {
		req.model = DefaultModel
	}
	return req, nil
}

func decode(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("We could not parse the JSON body of your request: %v", err)
	}
	return nil
}

// contentText flattens a chat message content: a string, or an array of
// {"type":"text","text":...} parts.
func contentText(raw json.RawMessage) string { return partsText(raw, true, "text", "") }

// partsText flattens a message content: a string, or the text of its parts of the given types;
// of an array that does not decode whole, strict takes nothing, else the parts that decoded.
func partsText(raw json.RawMessage, strict bool, types ...string) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil && strict {
		return ""
	}
	var texts []string
	for _, p := range parts {
		if slices.Contains(types, p.Type) {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, " ")
}

// stringList turns a prompt/input value into strings: a string is one item,
// an array contributes one item per element (strings as is, anything else,
// such as token arrays, as its compact JSON), null or absent gives none.
func stringList(raw json.RawMessage) []string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) == nil {
		out := make([]string, 0, len(items))
		for _, it := range items {
			if json.Unmarshal(it, &s) == nil {
				out = append(out, s)
				continue
			}
			var buf bytes.Buffer
			if json.Compact(&buf, it) == nil {
				out = append(out, buf.String())
			} else {
				out = append(out, string(it))
			}
		}
		return out
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) == nil {
		return []string{buf.String()}
	}
	return []string{string(raw)}
}

// echo builds the deterministic answer: "You said: <text>", whitespace
// normalised and capped at maxAnswerWords words. It always has at least three
// words, so a streamed answer has at least three chunks.
func echo(text string) string {
	words := strings.Fields(text)
	if len(words) == 0 {
		return "You said: nothing"
	}
	if len(words) > maxAnswerWords {
		words = append(words[:maxAnswerWords:maxAnswerWords], "...")
	}
	return "You said: " + strings.Join(words, " ")
}

// filler is what a generation of max_tokens words goes on with after the echo.
var filler = strings.Fields("and then the model went on generating tokens until it reached its limit")

// generate is a generation of exactly n words, as a model that runs until max_tokens: the
// echoed answer, cut or continued with filler, so that the answer's length (its
// usage.completion_tokens, its number of chunks) is the one the caller asked for.
func generate(answer string, n int) string {
	words := strings.Fields(answer)
	if len(words) >= n {
		return strings.Join(words[:n], " ")
	}
	out := make([]string, n)
	copy(out, words)
	for i := len(words); i < n; i++ {
		out[i] = filler[(i-len(words))%len(filler)]
	}
	return strings.Join(out, " ")
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type embeddingUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

type chatChoice struct {
	Index        int        `json:"index"`
	Message      chatOutput `json:"message"`
	Logprobs     *struct{}  `json:"logprobs"`
	FinishReason string     `json:"finish_reason"`
}

type chatOutput struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type chatDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type textCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []textChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
}

type textChoice struct {
	Text         string    `json:"text"`
	Index        int       `json:"index"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type embeddingList struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Data    []embeddingItem `json:"data"`
	Usage   embeddingUsage  `json:"usage"`
}

type embeddingItem struct {
	Object    string    `json:"object"`
	Index     int       `json:"index"`
	Embedding []float64 `json:"embedding"`
}

func (r *modelRequest) id(n int64) string {
	prefix := "chatcmpl-"
	switch r.kind {
	case kindCompletion:
		prefix = "cmpl-"
	case kindEmbedding:
		prefix = "embd-"
	}
	return prefix + strconv.FormatInt(n, 10)
}

func (r *modelRequest) usage() usage {
	c := len(strings.Fields(r.answer))
	return usage{PromptTokens: r.promptTokens, CompletionTokens: c, TotalTokens: r.promptTokens + c}
}

// response is the non-streamed answer of execution n.
func (r *modelRequest) response(n, created int64) any {
	switch r.kind {
	case kindCompletion:
		u := r.usage()
		return textCompletion{
			ID: r.id(n), Object: "text_completion", Created: created, Model: r.model,
			Choices: []textChoice{{Text: r.answer, FinishReason: ptr(r.finish)}},
			Usage:   &u,
		}
	case kindEmbedding:
		data := make([]embeddingItem, len(r.inputs))
		for i, in := range r.inputs {
			data[i] = embeddingItem{Object: "embedding", Index: i, Embedding: Embed(in, r.dimensions)}
		}
		return embeddingList{
			ID: r.id(n), Object: "list", Created: created, Model: r.model, Data: data,
			Usage: embeddingUsage{PromptTokens: r.promptTokens, TotalTokens: r.promptTokens},
		}
	default:
		return chatCompletion{
			ID: r.id(n), Object: "chat.completion", Created: created, Model: r.model,
			Choices: []chatChoice{{Message: chatOutput{Role: "assistant", Content: r.answer}, FinishReason: r.finish}},
			Usage:   r.usage(),
		}
	}
}

// chunks is the streamed answer of execution n: one chunk per word of the
// answer (concatenated they give the answer), the last one with
// the request's finish_reason.
func (r *modelRequest) chunks(n, created int64) []any {
	words := strings.Fields(r.answer)
	out := make([]any, len(words))
	for i, w := range words {
		if i > 0 {
			w = " " + w
		}
		var finish *string
		if i == len(words)-1 {
			finish = ptr(r.finish)
		}
		if r.kind == kindCompletion {
			out[i] = textCompletion{
				ID: r.id(n), Object: "text_completion", Created: created, Model: r.model,
				Choices: []textChoice{{Text: w, FinishReason: finish}},
			}
			continue
		}
		delta := chatDelta{Content: w}
		if i == 0 {
			delta.Role = "assistant"
		}
		out[i] = chatChunk{
			ID: r.id(n), Object: "chat.completion.chunk", Created: created, Model: r.model,
			Choices: []chatChunkChoice{{Delta: delta, FinishReason: finish}},
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// Embed returns the deterministic unit-length embedding of input with dims
// dimensions that the server answers for it, rounded to 6 decimals. Equal
// inputs give equal vectors; different inputs give (almost surely) different
// ones.
func Embed(input string, dims int) []float64 {
	if dims <= 0 {
		dims = defaultDimensions
	}
	v := make([]float64, dims)
	var block [sha256.Size]byte
	var norm float64
	for i := range v {
		if i%8 == 0 {
			var ctr [8]byte
			binary.BigEndian.PutUint64(ctr[:], uint64(i/8))
			h := sha256.New()
			h.Write(ctr[:])
			h.Write([]byte(input))
			h.Sum(block[:0])
		}
		u := binary.BigEndian.Uint32(block[(i%8)*4:])
		v[i] = float64(u)/math.MaxUint32*2 - 1
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	for i := range v {
		if norm > 0 {
			v[i] /= norm
		}
		v[i] = math.Round(v[i]*1e6) / 1e6
	}
	return v
}

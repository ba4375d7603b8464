package capacity

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
)

// usageKey is the member of an OpenAI-style answer's usage that says how long the generation
// was (docs/capacity.md, "limit auto").
var usageKey = []byte(`"completion_tokens"`)

// TokenScanner finds the last usage.completion_tokens in an answer written to it in pieces,
// without keeping the answer: only a short tail carried from one piece to the next.
type TokenScanner struct {
	tail   []byte
	tokens int
}

// scanTail is how much of a piece is carried to the next, so that a key and its number split
// across two writes are still found.
const scanTail = 40

// Write scans p; it never fails.
func (s *TokenScanner) Write(p []byte) (int, error) {
	buf := p
	if len(s.tail) > 0 {
		buf = append(s.tail, p...)
	}
	if n, ok := lastTokens(buf); ok {
		s.tokens = n
	}
	keep := min(len(buf), scanTail)
	s.tail = append(s.tail[:0:0], buf[len(buf)-keep:]...)
	return len(p), nil
}

// Tokens is the last usage.completion_tokens seen; 0: none.
func (s *TokenScanner) Tokens() int { return s.tokens }

// CompletionTokens is the last usage.completion_tokens of body; 0: none.
func CompletionTokens(body []byte) int {
	n, _ := lastTokens(body)
	return n
}

// lastTokens reads the number after the last complete `"completion_tokens": N` of b.
func lastTokens(b []byte) (int, bool) {
	for end := len(b); ; {
		i := bytes.LastIndex(b[:end], usageKey)
		if i < 0 {
			return 0, false
		}
		rest := b[i+len(usageKey):]
		j := 0
		for j < len(rest) && (rest[j] == ' ' || rest[j] == '\t' || rest[j] == '\n' || rest[j] == '\r') {
			j++
		}
		if j < len(rest) && rest[j] == ':' {
			j++
			for j < len(rest) && (rest[j] == ' ' || rest[j] == '\t' || rest[j] == '\n' || rest[j] == '\r') {
				j++
			}
			k := j
			for k < len(rest) && k-j < 9 && rest[k] >= '0' && rest[k] <= '9' {
				k++
			}
			if k > j && k < len(rest) && (rest[k] < '0' || rest[k] > '9') { // ended inside b, and short
				if n, err := strconv.Atoi(string(rest[j:k])); err == nil {
					return n, true
				}
			}
		}
		end = i
	}
}

// Overloaded reports whether a call's outcome tells the adaptive limit that the upstream is
// past its capacity: 429 or 503, or no answer before the deadline.
func Overloaded(status int, ctxErr error) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable ||
		(status == 0 && errors.Is(ctxErr, context.DeadlineExceeded))
}

// StreamedAnswer reports whether an answer with header h is server-sent events.
func StreamedAnswer(h http.Header) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(h.Get("Content-Type"))), "text/event-stream")
}

// AnswerSample is how a recorded answer tells the adaptive limit how its call went: its status
// and the generation's length from the answer's usage (docs/capacity.md).
func AnswerSample(status int, header http.Header, body []byte, ctxErr error) Sample {
	out := Sample{Status: status, Overloaded: Overloaded(status, ctxErr)}
	if status >= 200 && status < 300 {
		out.Tokens = CompletionTokens(body)
		out.Stream = StreamedAnswer(header)
	}
	return out
}

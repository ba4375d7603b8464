package capacity

import (
	"bytes"
	"strconv"
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

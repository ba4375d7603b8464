package capacity

import (
	"encoding/json"
	"errors"
	"strconv"
)

// Model servers that schedule by a request's "priority" field (docs/capacity.md, Passing
// urgency upstream).
const (
	PassPriorityVLLM   = "vllm"   // lower priority runs first
	PassPrioritySGLang = "sglang" // higher priority runs first
)

// ErrNotJSONObject is returned by SetBodyPriority for a body that is not one valid JSON object.
var ErrNotJSONObject = errors.New("request body is not a JSON object")

// ValidPassPriority reports whether mode names a server SetBodyPriority knows ("" is off).
func ValidPassPriority(mode string) bool {
	return mode == "" || mode == PassPriorityVLLM || mode == PassPrioritySGLang
}

// UpstreamPriority maps an RFC 9218 urgency (0 most urgent, 3 default, 7 least) to the
// priority a server of the given mode schedules by: vLLM runs lower values first, so
// urgency-3; SGLang runs higher values first, so 3-urgency. The default urgency maps to 0.
func UpstreamPriority(mode string, urgency int) int {
	if mode == PassPrioritySGLang {
		return urgencyDefault - urgency
	}
	return urgency - urgencyDefault
}

// SetBodyPriority returns body with its top-level "priority" member set to priority: every
// top-level member named "priority" (however escaped) is dropped and one is put first. The
// other members are kept byte for byte, in order; only whitespace between members and around
// the object is not. A body that is not one valid JSON object gives ErrNotJSONObject.
func SetBodyPriority(body []byte, priority int) ([]byte, error) {
	if !json.Valid(body) {
		return nil, ErrNotJSONObject
	}
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, ErrNotJSONObject
	}
	out := make([]byte, 0, len(body)+24)
	out = append(out, `{"priority":`...)
	out = strconv.AppendInt(out, int64(priority), 10)
	i = skipWS(body, i+1)
	if body[i] == '}' {
		return append(out, '}'), nil
	}
	for {
		start := i
		keyEnd := skipString(body, i)
		var key string
		if err := json.Unmarshal(body[start:keyEnd], &key); err != nil {
			return nil, ErrNotJSONObject
		}
		i = skipWS(body, keyEnd)
		i = skipWS(body, i+1) // the colon
		end := skipValue(body, i)
		if key != "priority" {
			out = append(out, ',')
			out = append(out, body[start:end]...)
		}
		i = skipWS(body, end)
		if body[i] == '}' {
			return append(out, '}'), nil
		}
		i = skipWS(body, i+1) // the comma
	}
}

// The scanners below run over a body json.Valid accepted, so they need no error checks.

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just after the string that starts at b[i] (a quote).
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index just after the value that starts at b[i].
func skipValue(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch c := b[i]; c {
		case '"':
			i = skipString(b, i)
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	return i
}

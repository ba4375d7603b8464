package capacity

import (
	"encoding/json"
	"errors"
	"strconv"

	"github.com/mulligan-gw/mulligan/store"
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

// RefusesBody reports whether a body declared JSON is one mode cannot set a priority in (not a
// JSON object): it is answered 400 before it waits for a seat or becomes an operation, so that
// live calls and operations refuse the same bodies. Off ("") refuses nothing.
func RefusesBody(mode, contentType string, body []byte) bool {
	if mode == "" || !IsJSON(contentType, int64(len(body))) {
		return false
	}
	_, err := SetBodyPriority(body, 0)
	return err != nil
}

// WithStoredPriority returns the request an operation's attempt sends upstream: a copy of req
// with its body's priority set at urgency (the operation's stored, trusted one) in mode's
// scale. Off, or a body that is not a JSON object, sends req as it is.
func WithStoredPriority(mode string, urgency int, req *store.Request) *store.Request {
	if mode == "" || req == nil || !IsJSON(req.Header.Get("Content-Type"), int64(len(req.Body))) {
		return req
	}
	body, err := SetBodyPriority(req.Body, UpstreamPriority(mode, urgency))
	if err != nil {
		return req
	}
	out := *req
	out.Header = req.Header.Clone()
	out.Header.Set("Content-Length", strconv.Itoa(len(body)))
	out.Body = body
	return &out
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

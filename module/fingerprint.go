package module

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"mime"
	"strings"
)

// fingerprinter computes the fingerprint of a request: SHA-256 over method, path, query,
// Content-Type and body. A JSON body is canonicalised first (key order, whitespace) with the
// configured JSON pointers dropped, so a client that re-serialises its payload on retry still
// matches.
type fingerprinter struct {
	ignore []pointer // parsed JSON pointers
}

func newFingerprinter(pointers []string) (*fingerprinter, error) {
	f := &fingerprinter{}
	for _, p := range pointers {
		tokens, err := parsePointer(p)
		if err != nil {
			return nil, err
		}
		f.ignore = append(f.ignore, pointerOf(tokens))
	}
	return f, nil
}

// sum returns the fingerprint.
func (f *fingerprinter) sum(method, path, query, contentType string, body []byte) []byte {
	mediaType, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		mediaType = strings.ToLower(strings.TrimSpace(contentType))
	} else {
		contentType = mime.FormatMediaType(mediaType, params)
	}
	if isJSON(mediaType) {
		if canon, ok := f.canonicalJSON(body); ok {
			body = canon
		}
	}
	h := sha256.New()
	for _, part := range []string{method, path, query, contentType} {
		writeField(h, []byte(part))
	}
	writeField(h, body)
	return h.Sum(nil)
}

// writeField length-prefixes each part, so no two different requests hash the same parts.
func writeField(h interface{ Write([]byte) (int, error) }, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	_, _ = h.Write(n[:])
	_, _ = h.Write(b)
}

func isJSON(mediaType string) bool {
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}

// canonicalJSON re-encodes body with sorted keys, no insignificant whitespace, numbers as
// written, and the ignored pointers removed: the text encoding/json gives for the body decoded
// into any. It reports false when body is not one JSON value, or when its shape would cost a
// multiple of the body to canonicalise (then the body is fingerprinted as written). See
// canonical.go.
func (f *fingerprinter) canonicalJSON(body []byte) ([]byte, bool) {
	c := &canonicaliser{in: body, ignore: f.ignore, out: make([]byte, 0, len(body)+1), bookkeeping: max(len(body)/2, minBookkeeping)}
	if c.document() != nil {
		return nil, false
	}
	return c.text(), true
}

// parsePointer splits an RFC 6901 JSON pointer into unescaped reference tokens.
func parsePointer(p string) ([]string, error) {
	if p == "" || p[0] != '/' {
		return nil, fmt.Errorf("JSON pointer %q must start with /", p)
	}
	tokens := strings.Split(p[1:], "/")
	for i, t := range tokens {
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

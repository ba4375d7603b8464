// Package fingerprint computes the fingerprint of a request that an idempotency key is bound
// to, over a canonical form of its JSON body (docs/api.md). It needs only the standard library.
package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"mime"
	"strings"
)

// Fingerprinter computes the fingerprint of a request: SHA-256 over method, path, query,
// Content-Type and body. A JSON body is canonicalised first (key order, whitespace) with the
// configured JSON pointers dropped, so a client that re-serialises its payload on retry still
// matches.
type Fingerprinter struct {
	ignore []pointer // parsed JSON pointers
}

// New returns a Fingerprinter that leaves out the given JSON pointers.
func New(pointers []string) (*Fingerprinter, error) {
	f := &Fingerprinter{}
	for _, p := range pointers {
		tokens, err := ParsePointer(p)
		if err != nil {
			return nil, err
		}
		f.ignore = append(f.ignore, pointerOf(tokens))
	}
	return f, nil
}

// Sum returns the fingerprint.
func (f *Fingerprinter) Sum(method, path, query, contentType string, body []byte) []byte {
	mediaType, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		mediaType = strings.ToLower(strings.TrimSpace(contentType))
	} else {
		contentType = mime.FormatMediaType(mediaType, params)
	}
	if IsJSON(mediaType) {
		if canon, ok := f.canonicalJSON(body); ok {
			body = canon
		}
	}
	h := sha256.New()
	for _, part := range []string{method, path, query, contentType} {
		WriteField(h, []byte(part))
	}
	WriteField(h, body)
	return h.Sum(nil)
}

// WriteField length-prefixes each part, so no two different requests hash the same parts.
func WriteField(h interface{ Write([]byte) (int, error) }, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	_, _ = h.Write(n[:])
	_, _ = h.Write(b)
}

// IsJSON reports whether mediaType is JSON (application/json or any +json type).
func IsJSON(mediaType string) bool {
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}

// canonicalJSON re-encodes body with sorted keys, no insignificant whitespace, numbers as
// written, and the ignored pointers removed: the text encoding/json gives for the body decoded
// into any. It reports false when body is not one JSON value, or when its shape would cost a
// multiple of the body to canonicalise (then the body is fingerprinted as written). See
// canonical.go.
func (f *Fingerprinter) canonicalJSON(body []byte) ([]byte, bool) {
	c := &canonicaliser{in: body, ignore: f.ignore, out: make([]byte, 0, len(body)+1), bookkeeping: max(len(body)/2, minBookkeeping)}
	if c.document() != nil {
		return nil, false
	}
	return c.text(), true
}

// ParsePointer splits an RFC 6901 JSON pointer into unescaped reference tokens.
func ParsePointer(p string) ([]string, error) {
	if p == "" || p[0] != '/' {
		return nil, fmt.Errorf("JSON pointer %q must start with /", p)
	}
	tokens := strings.Split(p[1:], "/")
	for i, t := range tokens {
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

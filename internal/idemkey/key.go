// Package idemkey parses Idempotency-Key header values and derives the store keys the gateway
// records them under (docs/api.md, Idempotency). It needs only the standard library and
// internal/fingerprint, so tools that seed or inspect a store (bench, operators' scripts)
// address records exactly as the gateway does.
package idemkey

import (
	"errors"
	"strings"
)

// MaxLen is the longest key accepted, in bytes.
const MaxLen = 255

var (
	errKeyEmpty     = errors.New("the idempotency key is empty")
	errKeyTooLong   = errors.New("the idempotency key is longer than 255 characters")
	errKeyBadChar   = errors.New("the idempotency key has a character outside printable ASCII")
	errKeyBadQuoted = errors.New("the idempotency key is a malformed quoted string (RFC 8941)")
)

// Parse validates an Idempotency-Key header value: 1..255 printable ASCII characters, or the
// same as an RFC 8941 sf-string ("abc", with \" and \\ escapes), which is unquoted. The IETF
// draft defines the header as an sf-string; many clients send the bare token.
func Parse(v string) (string, error) {
	if strings.HasPrefix(v, `"`) {
		return parseQuotedKey(v)
	}
	return Check(v)
}

func parseQuotedKey(v string) (string, error) {
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", errKeyBadQuoted
	}
	inner := v[1 : len(v)-1]
	var b strings.Builder
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '\\':
			i++
			if i == len(inner) || (inner[i] != '"' && inner[i] != '\\') {
				return "", errKeyBadQuoted
			}
			b.WriteByte(inner[i])
		case c == '"':
			return "", errKeyBadQuoted
		default:
			b.WriteByte(c)
		}
	}
	return Check(b.String())
}

// Check validates a bare key (no RFC 8941 quoting): 1..MaxLen printable ASCII characters.
func Check(k string) (string, error) {
	switch {
	case len(k) == 0:
		return "", errKeyEmpty
	case len(k) > MaxLen:
		return "", errKeyTooLong
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return "", errKeyBadChar
		}
	}
	return k, nil
}

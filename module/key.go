package module

import (
	"errors"
	"strings"
)

const maxKeyLen = 255

var (
	errKeyEmpty     = errors.New("the idempotency key is empty")
	errKeyTooLong   = errors.New("the idempotency key is longer than 255 characters")
	errKeyBadChar   = errors.New("the idempotency key has a character outside printable ASCII")
	errKeyBadQuoted = errors.New("the idempotency key is a malformed quoted string (RFC 8941)")
)

// parseKey validates an Idempotency-Key header value: 1..255 printable ASCII characters, or the
// same as an RFC 8941 sf-string ("abc", with \" and \\ escapes), which is unquoted. The IETF
// draft defines the header as an sf-string; many clients send the bare token.
func parseKey(v string) (string, error) {
	if strings.HasPrefix(v, `"`) {
		return parseQuotedKey(v)
	}
	return checkKey(v)
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
	return checkKey(b.String())
}

func checkKey(k string) (string, error) {
	switch {
	case len(k) == 0:
		return "", errKeyEmpty
	case len(k) > maxKeyLen:
		return "", errKeyTooLong
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return "", errKeyBadChar
		}
	}
	return k, nil
}

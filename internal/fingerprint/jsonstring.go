package fingerprint

import (
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// JSON strings for the canonical form: decoded as encoding/json decodes them, encoded as it
// encodes them (without HTML escaping).

// str decodes the string at pos into dst as encoding/json does: escapes resolved, a lone or
// broken surrogate and invalid UTF-8 as U+FFFD.
func (c *canonicaliser) str(dst []byte) ([]byte, error) {
	c.pos++ // the opening quote
	for c.pos < len(c.in) {
		b := c.in[c.pos]
		switch {
		case b == '"':
			c.pos++
			return dst, nil
		case b == '\\':
			var err error
			if dst, err = c.escape(dst); err != nil {
				return dst, err
			}
		case b < 0x20:
			return dst, errNotCanonical
		case b < utf8.RuneSelf:
			dst = append(dst, b)
			c.pos++
		default:
			r, size := utf8.DecodeRune(c.in[c.pos:])
			dst = utf8.AppendRune(dst, r) // RuneError stands for invalid bytes
			c.pos += size
		}
	}
	return dst, errNotCanonical
}

func (c *canonicaliser) escape(dst []byte) ([]byte, error) {
	if c.pos+1 >= len(c.in) {
		return dst, errNotCanonical
	}
	e := c.in[c.pos+1]
	c.pos += 2
	switch e {
	case '"', '\\', '/':
		return append(dst, e), nil
	case 'b':
		return append(dst, '\b'), nil
	case 'f':
		return append(dst, '\f'), nil
	case 'n':
		return append(dst, '\n'), nil
	case 'r':
		return append(dst, '\r'), nil
	case 't':
		return append(dst, '\t'), nil
	case 'u':
		r := hex4(c.in[c.pos:])
		if r < 0 {
			return dst, errNotCanonical
		}
		c.pos += 4
		if utf16.IsSurrogate(r) {
			if c.pos+1 < len(c.in) && c.in[c.pos] == '\\' && c.in[c.pos+1] == 'u' {
				if dec := utf16.DecodeRune(r, hex4(c.in[c.pos+2:])); dec != unicode.ReplacementChar {
					c.pos += 6
					return utf8.AppendRune(dst, dec), nil
				}
			}
			r = unicode.ReplacementChar
		}
		return utf8.AppendRune(dst, r), nil
	}
	return dst, errNotCanonical
}

// hex4 reads four hex digits; -1 when they are not there.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// appendJSONString is encoding/json's string encoding without HTML escaping: control
// characters, quote and backslash escaped, invalid UTF-8 as U+FFFD, U+2028 and U+2029 escaped.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(append(dst, s[start:]...), '"')
}

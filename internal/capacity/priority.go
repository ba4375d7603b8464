package capacity

import (
	"strconv"
	"strings"

	"github.com/mulligan-gw/mulligan/store"
)

// Urgencies of RFC 9218 (Extensible Prioritization Scheme for HTTP): 0 is the most urgent.
const (
	urgencyMost    = store.MostUrgent
	urgencyDefault = store.DefaultUrgency
	urgencyLeast   = store.LeastUrgent
)

// UrgencyOf reads the urgency of a request's Priority header (RFC 9218 §4.1): a Structured
// Field dictionary (RFC 8941 §3.2) whose member u is an integer from 0 to 7. Several header
// lines make one dictionary; of a key given twice the last value counts. Unknown members and
// parameters are ignored, and a header that does not parse, or a u that is not such an
// integer, leaves the default (RFC 9218 §4: a malformed signal is ignored, never an error).
func UrgencyOf(values []string) int {
	if len(values) == 0 {
		return urgencyDefault
	}
	members, ok := parseSFDictionary(strings.Join(values, ","))
	if !ok {
		return urgencyDefault
	}
	u, ok := members["u"]
	if !ok {
		return urgencyDefault
	}
	n, err := strconv.Atoi(u)
	if err != nil || len(u) > 15 || n < urgencyMost || n > urgencyLeast {
		return urgencyDefault
	}
	return n
}

// parseSFDictionary parses an RFC 8941 dictionary into each key's bare item as written
// (booleans, inner lists and parameters are checked for form, not kept).
func parseSFDictionary(s string) (map[string]string, bool) {
	p := sfParser{s: strings.Trim(s, " \t")}
	out := map[string]string{}
	for p.more() {
		key, ok := p.key()
		if !ok {
			return nil, false
		}
		value := "?1" // a member without "=" is boolean true
		if p.take('=') {
			if value, ok = p.member(); !ok {
				return nil, false
			}
		}
		if !p.params() {
			return nil, false
		}
		out[key] = value
		p.skipOWS()
		if !p.more() {
			break
		}
		if !p.take(',') {
			return nil, false
		}
		p.skipOWS()
		if !p.more() {
			return nil, false // a trailing comma
		}
	}
	return out, true
}

// sfParser walks a Structured Field value.
type sfParser struct {
	s string
	i int
}

func (p *sfParser) more() bool { return p.i < len(p.s) }

func (p *sfParser) take(c byte) bool {
	if p.more() && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *sfParser) skipOWS() {
	for p.more() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) skipSP() {
	for p.more() && p.s[p.i] == ' ' {
		p.i++
	}
}

// key reads lcalpha / "*" followed by lcalpha, digits, "_", "-", ".", "*" (RFC 8941 §4.2.3.3).
func (p *sfParser) key() (string, bool) {
	start := p.i
	if !p.more() || !(isLower(p.s[p.i]) || p.s[p.i] == '*') {
		return "", false
	}
	for p.i++; p.more() && (isLower(p.s[p.i]) || isDigit(p.s[p.i]) || strings.IndexByte("_-.*", p.s[p.i]) >= 0); p.i++ {
	}
	return p.s[start:p.i], true
}

// member reads an item or an inner list.
func (p *sfParser) member() (string, bool) {
	if !p.take('(') {
		return p.bareItem()
	}
	for {
		p.skipSP()
		if p.take(')') {
			return "()", true
		}
		if _, ok := p.bareItem(); !ok || !p.params() {
			return "", false
		}
		if p.more() && p.s[p.i] != ' ' && p.s[p.i] != ')' {
			return "", false
		}
	}
}

// params reads ";key[=item]" parameters, which RFC 9218 lets extensions add.
func (p *sfParser) params() bool {
	for p.take(';') {
		p.skipSP()
		if _, ok := p.key(); !ok {
			return false
		}
		if p.take('=') {
			if _, ok := p.bareItem(); !ok {
				return false
			}
		}
	}
	return true
}

// bareItem reads an integer or decimal, string, token, byte sequence or boolean.
func (p *sfParser) bareItem() (string, bool) {
	if !p.more() {
		return "", false
	}
	start := p.i
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		p.i++
		for p.more() && (isDigit(p.s[p.i]) || p.s[p.i] == '.') {
			p.i++
		}
		return p.s[start:p.i], p.s[p.i-1] != '-' && p.s[p.i-1] != '.'
	case c == '"':
		for p.i++; p.more(); p.i++ {
			switch p.s[p.i] {
			case '\\':
				p.i++
			case '"':
				p.i++
				return p.s[start:p.i], true
			}
		}
		return "", false
	case c == ':':
		end := strings.IndexByte(p.s[p.i+1:], ':')
		if end < 0 {
			return "", false
		}
		p.i += end + 2
		return p.s[start:p.i], true
	case c == '?':
		p.i++
		ok := p.take('0') || p.take('1')
		return p.s[start:p.i], ok
	case isAlpha(c) || c == '*':
		for p.i++; p.more() && isTokenChar(p.s[p.i]); p.i++ {
		}
		return p.s[start:p.i], true
	}
	return "", false
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool { return isLower(c) || (c >= 'A' && c <= 'Z') }

// isTokenChar is tchar, ":" or "/" (RFC 8941 §3.3.4).
func isTokenChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}

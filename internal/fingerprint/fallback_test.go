package fingerprint

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

// fallbackPairs are bodies that decode to the same value in encoding/json (which replaces
// invalid UTF-8 and lone surrogates with U+FFFD and keeps the last of a duplicated name) but
// are different requests: each must fingerprint apart (docs/api.md, fingerprint).
var fallbackPairs = [][2]string{
	{`{"p":"\ud800"}`, `{"p":"\ufffd"}`},
	{`{"p":"\udc00"}`, `{"p":"\ufffd"}`},
	{`{"p":"\ud800x"}`, `{"p":"\ufffdx"}`},
	{"{\"p\":\"\xff\"}", "{\"p\":\"\xfe\"}"},
	{"{\"p\":\"\xff\"}", `{"p":"\ufffd"}`},
	{"{\"\xff\":1}", "{\"\xfe\":1}"},
	{`{"model":"small","model":"large"}`, `{"model":"large"}`},
	{`{"a":{"x":1,"x":2}}`, `{"a":{"x":2}}`},
	{`{"metadata":{"request_id":"r","request_id":"s"}}`, `{"metadata":{"request_id":"s"}}`},
}

func TestFingerprintTellsApartBodiesJSONDecodingConflates(t *testing.T) {
	for _, ignore := range [][]string{nil, {"/metadata/request_id"}} {
		for _, pair := range fallbackPairs {
			a := fp(t, ignore, "POST", "/p", "", "application/json", pair[0])
			b := fp(t, ignore, "POST", "/p", "", "application/json", pair[1])
			if bytes.Equal(a, b) {
				t.Errorf("ignore %v: %q and %q have one fingerprint", ignore, pair[0], pair[1])
			}
		}
	}
}

func TestFingerprintStillCanonicalisesValidText(t *testing.T) {
	for _, pair := range [][2]string{
		{`{"p":"\ud83d\ude00","q":"é"}`, `{"q":"\u00e9","p":"😀"}`},
		{`{"p":"\ufffd"}`, "{\"p\":\"\xef\xbf\xbd\"}"},
		{`{"b":{"x":1},"a":{"x":2}}`, `{"a":{"x":2},"b":{"x":1}}`},
	} {
		a := fp(t, nil, "POST", "/p", "", "application/json", pair[0])
		b := fp(t, nil, "POST", "/p", "", "application/json", pair[1])
		if !bytes.Equal(a, b) {
			t.Errorf("%q and %q are one value written two ways, yet fingerprint apart", pair[0], pair[1])
		}
	}
}

// referenceFallsBack reports, independently of the canonicaliser, whether a body that
// encoding/json decodes must be fingerprinted as written: it holds invalid UTF-8, a lone
// surrogate escape, or a member name twice in one object.
func referenceFallsBack(body []byte) bool {
	if !utf8.Valid(body) {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // as the reference decodes: a number past float64 (1e700) is still JSON
	type frame struct {
		object, wantName bool
		seen             map[string]bool
	}
	var stack []*frame
	from := int64(0)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			return false // not JSON: the reference refuses it anyway
		}
		raw := body[from:dec.InputOffset()]
		from = dec.InputOffset()
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			continue
		}
		if s, ok := tok.(string); ok && hasLoneSurrogate(raw[bytes.IndexByte(raw, '"'):]) {
			return true
		} else if ok && top != nil && top.object && top.wantName {
			if top.seen[s] {
				return true
			}
			top.seen[s], top.wantName = true, false
			continue
		}
		if top != nil && top.object {
			top.wantName = true
		}
		if d, ok := tok.(json.Delim); ok {
			stack = append(stack, &frame{object: d == '{', wantName: d == '{', seen: map[string]bool{}})
		}
	}
}

// hasLoneSurrogate reports whether the quoted JSON string raw escapes half a surrogate pair.
func hasLoneSurrogate(raw []byte) bool {
	unit := func(i int) rune {
		if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
			return -1
		}
		n, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
		if err != nil {
			return -1
		}
		return rune(n)
	}
	for i := 1; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		r := unit(i)
		switch {
		case r < 0:
			i++ // a one-character escape
		case !utf16.IsSurrogate(r):
			i += 5
		case r < 0xdc00 && utf16.IsSurrogate(unit(i+6)) && unit(i+6) >= 0xdc00:
			i += 11
		default:
			return true
		}
	}
	return false
}

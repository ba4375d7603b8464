package store

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"slices"
	"unicode/utf8"
)

// Header values may hold bytes that are not UTF-8 (obs-text, RFC 9110 §5.5). encoding/json
// replaces those with U+FFFD, so a header stored as JSON would not replay (or be sent upstream)
// as it came. Headers that are all UTF-8 are stored as JSON, as they always were; the others in
// a binary form, so what is already stored still reads.

// headerBinary starts the binary form: no JSON text starts with it.
const headerBinary = 1

func headerIsText(h http.Header) bool {
	for name, values := range h {
		if !utf8.ValidString(name) {
			return false
		}
		for _, v := range values {
			if !utf8.ValidString(v) {
				return false
			}
		}
	}
	return true
}

// EncodeHeader is h as a backend stores it: JSON when it is all UTF-8, else a binary form that
// keeps every byte.
func EncodeHeader(h http.Header) ([]byte, error) {
	if headerIsText(h) {
		return json.Marshal(h)
	}
	return encodeHeaderBinary(h), nil
}

// DecodeHeader reads what EncodeHeader wrote.
func DecodeHeader(b []byte) (http.Header, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != headerBinary {
		var h http.Header
		return h, json.Unmarshal(b, &h)
	}
	d := &decoder{b: b[1:]}
	n := d.uvarint()
	if n > uint64(len(b)) {
		return nil, ErrCorrupt
	}
	h := make(http.Header, n)
	for range n {
		name, count := string(d.bytes()), d.uvarint()
		if count > uint64(len(b)) {
			return nil, ErrCorrupt
		}
		values := make([]string, 0, count)
		for range count {
			values = append(values, string(d.bytes()))
		}
		h[name] = values
	}
	if d.err || len(d.rest()) != 0 {
		return nil, ErrCorrupt
	}
	return h, nil
}

func encodeHeaderBinary(h http.Header) []byte {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	out := binary.AppendUvarint([]byte{headerBinary}, uint64(len(names)))
	for _, name := range names {
		out = appendBytes(out, []byte(name))
		out = binary.AppendUvarint(out, uint64(len(h[name])))
		for _, v := range h[name] {
			out = appendBytes(out, []byte(v))
		}
	}
	return out
}

// In the JSON of a Request or a Response, the header is "header" when it is all UTF-8, else
// "header_raw": the binary form (base64, as JSON carries bytes). The wrappers' own fields shadow
// the embedded Header.

// MarshalJSON keeps the header's bytes.
func (r Request) MarshalJSON() ([]byte, error) {
	type plain Request
	v := struct {
		plain
		Header http.Header `json:"header,omitempty"`
		Raw    []byte      `json:"header_raw,omitempty"`
	}{plain: plain(r)}
	v.Header, v.Raw = splitHeader(r.Header)
	return json.Marshal(v)
}

// UnmarshalJSON reads what MarshalJSON wrote; Body is left as it is.
func (r *Request) UnmarshalJSON(b []byte) error {
	type plain Request
	var v struct {
		plain
		Header http.Header `json:"header"`
		Raw    []byte      `json:"header_raw"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	h, err := joinHeader(v.Header, v.Raw)
	if err != nil {
		return err
	}
	body := r.Body
	*r = Request(v.plain)
	r.Header, r.Body = h, body
	return nil
}

// MarshalJSON keeps the header's bytes.
func (r Response) MarshalJSON() ([]byte, error) {
	type plain Response
	v := struct {
		plain
		Header http.Header `json:"header,omitempty"`
		Raw    []byte      `json:"header_raw,omitempty"`
	}{plain: plain(r)}
	v.Header, v.Raw = splitHeader(r.Header)
	return json.Marshal(v)
}

// UnmarshalJSON reads what MarshalJSON wrote; Body is left as it is.
func (r *Response) UnmarshalJSON(b []byte) error {
	type plain Response
	var v struct {
		plain
		Header http.Header `json:"header"`
		Raw    []byte      `json:"header_raw"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	h, err := joinHeader(v.Header, v.Raw)
	if err != nil {
		return err
	}
	body := r.Body
	*r = Response(v.plain)
	r.Header, r.Body = h, body
	return nil
}

// splitHeader is h as JSON carries it: as it is when all UTF-8, else in binary.
func splitHeader(h http.Header) (http.Header, []byte) {
	if headerIsText(h) {
		return h, nil
	}
	return nil, encodeHeaderBinary(h)
}

func joinHeader(h http.Header, raw []byte) (http.Header, error) {
	if raw == nil {
		return h, nil
	}
	return DecodeHeader(raw)
}

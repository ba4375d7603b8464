package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Values are stored as a version byte, a length-prefixed JSON header, then raw bytes (a body),
// so a large body is neither base64-inflated nor re-parsed.
const codecVersion = 1

// ErrCorrupt is returned for a stored value that does not decode.
var ErrCorrupt = errors.New("corrupt record")

// Encode lays out meta (as JSON) and raw as one stored value (see Decode).
func Encode(meta any, raw []byte) ([]byte, error) {
	m, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 1+binary.MaxVarintLen64+len(m)+len(raw))
	out = append(out, codecVersion)
	out = binary.AppendUvarint(out, uint64(len(m)))
	out = append(out, m...)
	return append(out, raw...), nil
}

// Decode fills meta and returns a copy of the raw bytes.
func Decode(v []byte, meta any) ([]byte, error) {
	if len(v) < 2 || v[0] != codecVersion {
		return nil, ErrCorrupt
	}
	n, sz := binary.Uvarint(v[1:])
	if sz <= 0 || uint64(len(v)-1-sz) < n {
		return nil, ErrCorrupt
	}
	end := 1 + sz + int(n)
	if err := json.Unmarshal(v[1+sz:end], meta); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return append([]byte(nil), v[end:]...), nil
}

// Idempotency records, read and written on every keyed request, have a binary form of their
// own (version 2): a byte per field kind, lengths as uvarints, times as Unix nanoseconds.
const recordVersion = 2

// EncodeRecord is the binary form of an idempotency record (Badger stores it as is).
func EncodeRecord(rec *Record) ([]byte, error) {
	var body []byte
	out := make([]byte, 0, 128)
	out = append(out, recordVersion, byte(rec.State))
	out = appendBytes(out, rec.Fingerprint)
	out = appendBytes(out, []byte(rec.Token))
	out = appendBytes(out, []byte(rec.OperationID))
	for _, t := range []time.Time{rec.ClaimedAt, rec.LeaseUntil, rec.ExpiresAt} {
		out = binary.AppendVarint(out, unixNano(t))
	}
	switch {
	case rec.Response == nil:
		return append(out, 0), nil
	case rec.Streamed:
		out = append(out, 2) // status and headers; the body is the stream's events
	default:
		out = append(out, 1)
	}
	out = binary.AppendUvarint(out, uint64(rec.Response.Status))
	out = binary.AppendUvarint(out, uint64(len(rec.Response.Header)))
	for name, values := range rec.Response.Header {
		out = appendBytes(out, []byte(name))
		out = binary.AppendUvarint(out, uint64(len(values)))
		for _, v := range values {
			out = appendBytes(out, []byte(v))
		}
	}
	body = rec.Response.Body
	return append(out, body...), nil
}

// DecodeRecord reads what EncodeRecord wrote; anything else is ErrCorrupt.
func DecodeRecord(v []byte) (*Record, error) {
	d := &decoder{b: v}
	if d.byte() != recordVersion {
		return nil, ErrCorrupt
	}
	rec := &Record{State: RecordState(d.byte())}
	rec.Fingerprint = d.bytes()
	rec.Token, rec.OperationID = string(d.bytes()), string(d.bytes())
	rec.ClaimedAt, rec.LeaseUntil, rec.ExpiresAt = d.time(), d.time(), d.time()
	if kind := d.byte(); kind == 1 || kind == 2 {
		rec.Streamed = kind == 2
		resp := &Response{Status: int(d.uvarint())}
		n := d.uvarint()
		if n > uint64(len(v)) {
			return nil, ErrCorrupt
		}
		resp.Header = make(http.Header, n)
		for range n {
			name, count := string(d.bytes()), d.uvarint()
			if count > uint64(len(v)) {
				return nil, ErrCorrupt
			}
			values := make([]string, 0, count)
			for range count {
				values = append(values, string(d.bytes()))
			}
			resp.Header[name] = values
		}
		resp.Body = append([]byte(nil), d.rest()...)
		rec.Response = resp
	}
	if d.err {
		return nil, ErrCorrupt
	}
	return rec, nil
}

func appendBytes(out, b []byte) []byte {
	out = binary.AppendUvarint(out, uint64(len(b)))
	return append(out, b...)
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// decoder reads EncodeRecord's fields; past the end or on a bad length it sets err and yields
// zero values.
type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.err = true
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	n, sz := binary.Uvarint(d.b)
	if sz <= 0 {
		d.err = true
		return 0
	}
	d.b = d.b[sz:]
	return n
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.err = true
		return nil
	}
	out := append([]byte(nil), d.b[:n]...)
	d.b = d.b[n:]
	return out
}

func (d *decoder) time() time.Time {
	n, sz := binary.Varint(d.b)
	if sz <= 0 {
		d.err = true
		return time.Time{}
	}
	d.b = d.b[sz:]
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func (d *decoder) rest() []byte { return d.b }

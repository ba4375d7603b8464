package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// Values are stored as a version byte, a length-prefixed JSON header, then raw bytes (a body),
// so a large body is neither base64-inflated nor re-parsed.
const codecVersion = 1

var errCorrupt = errors.New("corrupt record")

func encode(meta any, raw []byte) ([]byte, error) {
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

// decode fills meta and returns a copy of the raw bytes.
func decode(v []byte, meta any) ([]byte, error) {
	if len(v) < 2 || v[0] != codecVersion {
		return nil, errCorrupt
	}
	n, sz := binary.Uvarint(v[1:])
	if sz <= 0 || uint64(len(v)-1-sz) < n {
		return nil, errCorrupt
	}
	end := 1 + sz + int(n)
	if err := json.Unmarshal(v[1+sz:end], meta); err != nil {
		return nil, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	return append([]byte(nil), v[end:]...), nil
}

func encodeRecord(rec *Record) ([]byte, error) {
	var body []byte
	if rec.Response != nil {
		body = rec.Response.Body
	}
	return encode(rec, body)
}

func decodeRecord(v []byte) (*Record, error) {
	var rec Record
	body, err := decode(v, &rec)
	if err != nil {
		return nil, err
	}
	if rec.Response != nil {
		rec.Response.Body = body
	}
	return &rec, nil
}

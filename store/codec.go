package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// Records are stored as a length-prefixed JSON header followed by the raw response body, so a
// large body is neither base64-inflated nor re-parsed.
const codecVersion = 1

func encodeRecord(rec *Record) ([]byte, error) {
	meta, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	var body []byte
	if rec.Response != nil {
		body = rec.Response.Body
	}
	out := make([]byte, 0, 1+binary.MaxVarintLen64+len(meta)+len(body))
	out = append(out, codecVersion)
	out = binary.AppendUvarint(out, uint64(len(meta)))
	out = append(out, meta...)
	return append(out, body...), nil
}

var errCorrupt = errors.New("corrupt record")

func decodeRecord(v []byte) (*Record, error) {
	if len(v) < 2 || v[0] != codecVersion {
		return nil, errCorrupt
	}
	n, sz := binary.Uvarint(v[1:])
	if sz <= 0 || uint64(len(v)-1-sz) < n {
		return nil, errCorrupt
	}
	meta := v[1+sz : 1+sz+int(n)]
	var rec Record
	if err := json.Unmarshal(meta, &rec); err != nil {
		return nil, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	if rec.Response != nil {
		rec.Response.Body = append([]byte(nil), v[1+sz+int(n):]...)
	}
	return &rec, nil
}

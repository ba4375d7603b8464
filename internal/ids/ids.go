// Package ids makes the gateway's ids (operations, events, requests, workers, seats): a prefix,
// then 48 bits of Unix milliseconds and 128 random bits in Crockford's base32, lower-cased, so
// ids are unguessable and sort by creation time. Standard library only.
package ids

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"time"
)

// crockford is Crockford's base32 alphabet, lower-cased: ids sort as their bytes do.
var crockford = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// New returns prefix followed by now's Unix milliseconds and 128 random bits.
func New(prefix string, now time.Time) string {
	var b [22]byte // 6 time bytes, 16 random bytes
	ms := uint64(now.UnixMilli())
	var t [8]byte
	binary.BigEndian.PutUint64(t[:], ms)
	copy(b[:6], t[2:])
	_, _ = rand.Read(b[6:])
	return prefix + crockford.EncodeToString(b[:])
}

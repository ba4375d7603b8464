package module

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"net/http"
	"time"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/idemkey"
)

// crockford is Crockford's base32 alphabet, lower-cased: ids sort as their bytes do.
var crockford = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// newID returns prefix followed by 48 bits of Unix milliseconds and 128 random bits, so ids are
// unguessable and sort by creation time.
func newID(prefix string, now time.Time) string {
	var b [22]byte // 6 time bytes, 16 random bytes
	ms := uint64(now.UnixMilli())
	var t [8]byte
	binary.BigEndian.PutUint64(t[:], ms)
	copy(b[:6], t[2:])
	_, _ = rand.Read(b[6:])
	return prefix + crockford.EncodeToString(b[:])
}

const headerRequestID = apierr.HeaderRequestID

// requestID returns the client's X-Request-Id when it is a sane token, else a fresh id.
func requestID(r *http.Request, now time.Time) string {
	if id := r.Header.Get(headerRequestID); id != "" && len(id) <= 128 {
		if _, err := idemkey.Check(id); err == nil {
			return id
		}
	}
	return newID("srv_req_", now)
}

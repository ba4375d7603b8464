package module

import (
	"net/http"
	"time"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/idemkey"
	"github.com/mulligan-gw/mulligan/internal/ids"
)

// newID is ids.New: a prefix, the time, 128 random bits.
func newID(prefix string, now time.Time) string { return ids.New(prefix, now) }

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

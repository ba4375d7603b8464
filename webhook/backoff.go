package webhook

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxRetryAfter caps how long a Retry-After header can postpone the next
// attempt, so a misconfigured receiver cannot park an event for days.
const MaxRetryAfter = time.Hour

// Backoff returns how long to wait before retry number attempt (0 for the
// first retry, 1 for the second, ...): exponential backoff with full jitter,
// a uniformly random duration between minWait and minWait·2^(attempt+1), that
// ceiling capped at maxWait. The randomness spreads the retries of many
// events instead of letting them arrive together. Backoff never returns less
// than minWait, nor less than retryAfter (the receiver's Retry-After, itself
// capped at [MaxRetryAfter]).
//
// Both the in-process retries of [Deliverer] and the durable outbox schedule
// with it, so there is one retry policy.
func Backoff(minWait, maxWait time.Duration, attempt int, retryAfter time.Duration) time.Duration {
	minWait = max(minWait, 0)
	maxWait = max(maxWait, minWait)
	ceiling := max(minWait, time.Millisecond)
	for i := 0; i <= attempt && ceiling < maxWait; i++ {
		if ceiling > maxWait/2 {
			ceiling = maxWait
			break
		}
		ceiling *= 2
	}
	ceiling = min(ceiling, maxWait)
	wait := minWait
	if ceiling > minWait {
		wait += rand.N(ceiling - minWait + 1)
	}
	return max(wait, min(retryAfter, MaxRetryAfter))
}

// retryAfter reads a response's Retry-After (see ParseRetryAfter); 0 when
// resp is nil.
func retryAfter(resp *http.Response, now time.Time) time.Duration {
	if resp == nil {
		return 0
	}
	return ParseRetryAfter(resp.Header.Get("Retry-After"), now)
}

// ParseRetryAfter reads a Retry-After value, either delay seconds or an HTTP
// date relative to now (RFC 9110 §10.2.3), capped at MaxRetryAfter. It
// returns 0 when the value is absent or unparsable.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs >= int64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter
		}
		return time.Duration(secs) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return min(max(at.Sub(now), 0), MaxRetryAfter)
	}
	return 0
}

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

// DefaultSchedule is the wait before each retry of an event in the durable outbox (Svix's
// spacing): after the first attempt fails the event is tried again 5s later, then 5m, 30m, 2h,
// 5h, 10h and 10h later, eight attempts over more than a day, so a receiver down for hours
// loses nothing.
var DefaultSchedule = []time.Duration{
	5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour,
}

// scheduleJitter is the most a scheduled wait is lengthened by, as a fraction of it: waits are
// only ever lengthened, so the schedule's span is a floor.
const scheduleJitter = 0.2

// ScheduledWait returns how long to wait before retry number retry (0 for the first retry) on
// schedule: the schedule's wait (its last one repeating past its end) plus up to 20% of
// random jitter, never less than retryAfter (capped at [MaxRetryAfter]).
func ScheduledWait(schedule []time.Duration, retry int, retryAfter time.Duration) time.Duration {
	if len(schedule) == 0 {
		return min(max(retryAfter, 0), MaxRetryAfter)
	}
	wait := schedule[min(max(retry, 0), len(schedule)-1)]
	if spread := time.Duration(float64(wait) * scheduleJitter); spread > 0 {
		wait += rand.N(spread + 1)
	}
	return max(wait, min(retryAfter, MaxRetryAfter))
}

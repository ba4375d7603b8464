package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Result is what the outbox should do after one Deliver call.
type Result int

// The results of a Deliver call; see [Outcome].
const (
	// Delivered: the endpoint answered 2xx. The event is done.
	Delivered Result = iota + 1
	// RetryLater: a transport error, timeout, 3xx, 408, 429 or 5xx. Schedule
	// another attempt with Backoff (honouring Outcome.RetryAfter).
	RetryLater
	// Disabled: the endpoint answered 410 Gone; stop sending it anything.
	Disabled
	// DeadLetter: the endpoint answered another 4xx, the address is blocked by
	// the SSRF guard, or the endpoint or message is unusable. Retrying will
	// not help; keep the event for inspection and manual redelivery.
	DeadLetter
	// BreakerOpen: nothing was sent because the endpoint's circuit breaker is
	// open (or its one half-open probe is in flight). Not an attempt: wait for
	// the breaker's cooldown and try again without counting it.
	BreakerOpen
)

// String returns a stable lower-case name, suitable as a metric label.
func (r Result) String() string {
	switch r {
	case Delivered:
		return "delivered"
	case RetryLater:
		return "retry_later"
	case Disabled:
		return "disabled"
	case DeadLetter:
		return "dead_letter"
	case BreakerOpen:
		return "breaker_open"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// Outcome describes one Deliver call, for the outbox to record.
type Outcome struct {
	// Result says what to do next.
	Result Result
	// Attempts is the number of HTTP attempts started in this call (1 plus
	// in-process retries), including attempts that failed before any
	// response, such as a refused connection. 0 for BreakerOpen and for
	// messages refused before sending.
	Attempts int
	// StatusCode is the last response's status, 0 when there was none.
	StatusCode int
	// Err explains every result but Delivered; nil for Delivered.
	Err error
	// Latency is the duration of the last attempt, from sending the request
	// to receiving the response headers or failing.
	Latency time.Duration
	// RetryAfter is the last response's Retry-After (delay seconds or HTTP
	// date), capped at MaxRetryAfter; 0 when absent. Pass it to Backoff.
	RetryAfter time.Duration
}

// errCallerGone marks an outcome cut short by the caller's context, which
// says nothing about the endpoint's health.
var errCallerGone = errors.New("webhook: delivery abandoned by the caller")

// classify maps the last response or error of a Deliver call to a Result,
// per the Standard Webhooks status-code handling. A response, once received,
// decides even if the caller's context ended just after.
func classify(ctx context.Context, resp *http.Response, err error) (Result, error) {
	switch {
	case err == nil && resp != nil:
		return classifyStatus(resp)
	case ctx.Err() != nil:
		return RetryLater, fmt.Errorf("%w: %w", errCallerGone, context.Cause(ctx))
	case errors.Is(err, ErrBlockedAddress):
		return DeadLetter, err
	case err == nil:
		return RetryLater, errors.New("webhook: no response")
	}
	return RetryLater, err
}

// classifyStatus maps a response status to a Result.
func classifyStatus(resp *http.Response) (Result, error) {
	code := resp.StatusCode
	switch {
	case code >= 200 && code <= 299:
		return Delivered, nil
	case code == http.StatusGone:
		return Disabled, statusError(resp)
	case code >= 400 && code <= 499 && !retryableStatus(code):
		return DeadLetter, statusError(resp)
	}
	// 3xx (redirects are never followed), 408, 429, 5xx and anything odd.
	return RetryLater, statusError(resp)
}

// retryableStatus reports the statuses that mean "try again later":
// 408 Request Timeout, 429 Too Many Requests and every 5xx.
func retryableStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || (code >= 500 && code <= 599)
}

func statusError(resp *http.Response) error {
	return fmt.Errorf("webhook: endpoint answered %s", resp.Status)
}

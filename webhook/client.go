package webhook

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// dialTimeout backstops connection setup; each attempt's Endpoint.Timeout
// usually ends it sooner.
const dialTimeout = 30 * time.Second

// call is the state of one Deliver call that the retry hooks share through
// the request context. retryablehttp runs the hooks one after another on the
// goroutine that called Do, so it needs no lock.
type call struct {
	style     Style
	secrets   []Secret
	msgID     string
	body      []byte
	timeout   time.Duration
	attempts  int       // HTTP attempts started
	lastStart time.Time // when the latest attempt started
}

type callKey struct{}

func withCall(ctx context.Context, c *call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

func callOf(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// newClient builds the HTTP client of one SSRF policy. There is one per
// policy rather than one per Deliverer, so a pooled connection dialled for
// an AllowPrivate endpoint is never reused by a guarded one.
func (d *Deliverer) newClient(allowPrivate bool) *retryablehttp.Client {
	transport := &http.Transport{
		Proxy:                 nil, // through a proxy the guard would check the proxy, not the endpoint
		DialContext:           NewDialer(allowPrivate, dialTimeout).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &retryablehttp.Client{
		HTTPClient: &http.Client{
			Transport: attemptTimeout{next: transport},
			// Redirects are failures, never followed (Standard Webhooks): the
			// endpoint's URL should be updated instead, and following one could
			// lead the request somewhere the allow-list never approved.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		Logger:         nil, // the caller logs Outcomes; the library must not log URLs or bodies
		RetryWaitMin:   d.opts.BackoffMin,
		RetryWaitMax:   d.opts.BackoffMax,
		RetryMax:       d.opts.InProcessRetries,
		RequestLogHook: countAttempt,
		CheckRetry:     d.checkRetry,
		Backoff:        d.backoff,
		ErrorHandler:   keepLastResponse,
		PrepareRetry:   d.resign,
	}
}

// checkRetry decides whether to retry in process: transport errors (but not
// SSRF refusals), 408, 429 and 5xx, unless the caller gave up or the
// receiver's Retry-After is longer than we wait in process, which the
// outbox honours instead. 3xx and other 4xx are final for this call.
func (d *Deliverer) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		return !errors.Is(err, ErrBlockedAddress), nil
	}
	if !retryableStatus(resp.StatusCode) {
		return false, nil
	}
	return retryAfter(resp, d.opts.Now()) <= d.opts.BackoffMax, nil
}

// backoff adapts Backoff to retryablehttp.
func (d *Deliverer) backoff(minWait, maxWait time.Duration, attempt int, resp *http.Response) time.Duration {
	return Backoff(minWait, maxWait, attempt, retryAfter(resp, d.opts.Now()))
}

// resign gives a retry its own timestamp and signatures, as Standard
// Webhooks requires, on a copy of the headers the previous attempt used.
func (d *Deliverer) resign(req *http.Request) error {
	req.Header = req.Header.Clone()
	d.sign(req.Header, callOf(req.Context()))
	return nil
}

// countAttempt runs before every attempt.
func countAttempt(_ retryablehttp.Logger, req *http.Request, _ int) {
	if c := callOf(req.Context()); c != nil {
		c.attempts++
		c.lastStart = time.Now()
	}
}

// keepLastResponse hands the last response (or error) back to Deliver once
// retries are exhausted, so it can be classified; the default would drop it.
func keepLastResponse(resp *http.Response, err error, _ int) (*http.Response, error) {
	return resp, err
}

// attemptTimeout bounds each attempt by its endpoint's timeout, leaving the
// caller's context to bound the whole Deliver call.
type attemptTimeout struct {
	next http.RoundTripper
}

// RoundTrip runs one attempt under the endpoint's timeout; the timeout's
// context is released when the response body is closed.
func (t attemptTimeout) RoundTrip(req *http.Request) (*http.Response, error) {
	c := callOf(req.Context())
	if c == nil || c.timeout <= 0 {
		return t.next.RoundTrip(req)
	}
	ctx, cancel := context.WithTimeout(req.Context(), c.timeout)
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/sony/gobreaker/v2"
)

// DefaultTimeout bounds each attempt of an endpoint without a Timeout; the
// Standard Webhooks specification recommends 15 to 30 seconds.
const DefaultTimeout = 15 * time.Second

// Endpoint is a configured webhook receiver.
type Endpoint struct {
	// Name identifies the endpoint in configuration and metrics, and keys
	// its circuit breaker.
	Name string
	// URL receives the POST; it must be http or https.
	URL string
	// Secrets sign every attempt, current secret first; list the old one
	// too while a rotation is in progress.
	Secrets []Secret
	// Timeout bounds each HTTP attempt (connect, send, response headers);
	// 0 means DefaultTimeout.
	Timeout time.Duration
	// AllowPrivate turns the SSRF guard off for this endpoint, allowing
	// loopback, private and other special-purpose addresses.
	AllowPrivate bool
	// Style picks the signature headers; the zero value is StandardWebhooks.
	Style Style
}

// Message is one event to deliver.
type Message struct {
	// ID is sent as webhook-id and must stay the same across every retry:
	// consumers deduplicate on it. It may not contain '.', the separator of
	// the signed content.
	ID string
	// Body is the JSON payload, sent and signed byte for byte.
	Body []byte
	// Header holds extra headers sent with every attempt, such as the W3C traceparent of the
	// work the event is about. The content type, user agent and signature headers are set over
	// them.
	Header http.Header
	// Type is sent as X-Event-Type, in either style, when not empty.
	Type string
}

// Options configures a Deliverer. Every zero value has a safe default.
type Options struct {
	// InProcessRetries is how many times Deliver retries a retryable failure
	// before returning RetryLater to the outbox; keep it small (0 to 2). A
	// Retry-After longer than BackoffMax is never waited for in process.
	InProcessRetries int
	// BackoffMin and BackoffMax bound the in-process waits (see Backoff).
	// Defaults: 1s and 30s.
	BackoffMin, BackoffMax time.Duration
	// BreakerFailures is how many consecutive failed Deliver calls open an
	// endpoint's circuit breaker. Default 5.
	BreakerFailures uint32
	// BreakerCooldown is how long a breaker stays open before letting one
	// probe through. Default 30s.
	BreakerCooldown time.Duration
	// Now stamps webhook-timestamp and reads Retry-After dates. Default time.Now.
	Now func() time.Time
	// UserAgent is sent with every attempt. Default "Mulligan-Webhooks/1".
	UserAgent string
}

// Deliverer sends messages to endpoints. It is safe for concurrent use and
// should live as long as the process, so connections are reused.
type Deliverer struct {
	opts     Options
	guarded  *retryablehttp.Client // dials through the SSRF guard
	open     *retryablehttp.Client // for endpoints with AllowPrivate
	breakers breakers
}

// NewDeliverer returns a Deliverer with opts, defaults filled in.
func NewDeliverer(opts Options) *Deliverer {
	opts.InProcessRetries = max(opts.InProcessRetries, 0)
	if opts.BackoffMin <= 0 {
		opts.BackoffMin = time.Second
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = 30 * time.Second
	}
	opts.BackoffMax = max(opts.BackoffMax, opts.BackoffMin)
	if opts.BreakerFailures == 0 {
		opts.BreakerFailures = 5
	}
	if opts.BreakerCooldown <= 0 {
		opts.BreakerCooldown = 30 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.UserAgent == "" {
		opts.UserAgent = "Mulligan-Webhooks/1"
	}
	d := &Deliverer{opts: opts, breakers: newBreakers(opts.BreakerFailures, opts.BreakerCooldown)}
	d.guarded = d.newClient(false)
	d.open = d.newClient(true)
	return d
}

// Deliver sends msg to ep once, with up to InProcessRetries quick retries,
// each attempt signed afresh, and reports the Outcome. It persists nothing:
// the caller records the outcome and, for RetryLater, schedules the next try
// with Backoff. While ep's circuit breaker is open it sends nothing and
// returns BreakerOpen.
func (d *Deliverer) Deliver(ctx context.Context, ep Endpoint, msg Message) Outcome {
	out, err := d.breakers.get(ep.Name).Execute(func() (Outcome, error) {
		o := d.send(ctx, ep, msg)
		return o, breakerFailure(o)
	})
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		return Outcome{Result: BreakerOpen, Err: fmt.Errorf("webhook: endpoint %q: %w", ep.Name, err)}
	}
	return out
}

// send performs the HTTP attempts of one Deliver call and classifies the last.
func (d *Deliverer) send(ctx context.Context, ep Endpoint, msg Message) Outcome {
	if err := checkDelivery(ep, msg); err != nil {
		return Outcome{Result: DeadLetter, Err: err}
	}
	c := &call{style: ep.Style, secrets: ep.Secrets, msgID: msg.ID, body: msg.Body, timeout: ep.Timeout}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	req, err := retryablehttp.NewRequestWithContext(withCall(ctx, c), http.MethodPost, ep.URL, msg.Body)
	if err != nil {
		return Outcome{Result: DeadLetter, Err: fmt.Errorf("webhook: endpoint %q: %w", ep.Name, err)}
	}
	for name, values := range msg.Header {
		req.Header[http.CanonicalHeaderKey(name)] = slices.Clone(values)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", d.opts.UserAgent)
	if msg.Type != "" {
		req.Header.Set(HeaderEventType, msg.Type)
	}
	d.sign(req.Header, c)

	client := d.guarded
	if ep.AllowPrivate {
		client = d.open
	}
	resp, err := client.Do(req)
	out := Outcome{Attempts: c.attempts}
	if c.attempts > 0 {
		out.Latency = time.Since(c.lastStart)
	}
	if resp != nil {
		out.StatusCode = resp.StatusCode
		out.RetryAfter = retryAfter(resp, d.opts.Now())
		discard(resp.Body)
	}
	out.Result, out.Err = classify(ctx, resp, err)
	return out
}

// sign stamps one attempt in the endpoint's style: the id, a fresh timestamp and its
// signatures.
func (d *Deliverer) sign(h http.Header, c *call) {
	signHeaders(h, c.style, c.secrets, c.msgID, d.opts.Now(), c.body)
}

// checkDelivery refuses what can never be delivered, before any attempt.
func checkDelivery(ep Endpoint, msg Message) error {
	if len(ep.Secrets) == 0 {
		return fmt.Errorf("webhook: endpoint %q has no signing secret", ep.Name)
	}
	u, err := url.Parse(ep.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("webhook: endpoint %q: URL %q is not an absolute http(s) URL", ep.Name, ep.URL)
	}
	if msg.ID == "" || strings.Contains(msg.ID, ".") {
		return fmt.Errorf("webhook: message id %q must be non-empty and contain no '.'", msg.ID)
	}
	return nil
}

// discard reads a little of an unwanted response body so the connection can
// be reused, then closes it.
func discard(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	_ = body.Close()
}

package module

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/internal/batches"
	"github.com/mulligan-gw/mulligan/webhook"
)

// Event types.
const (
	EventSucceeded = "operation.succeeded"
	EventFailed    = "operation.failed"
	EventCanceled  = "operation.canceled"
	EventRunning   = "operation.running"
)

// WebhooksConfig configures signed webhook delivery (docs/caddyfile.md, webhooks).
type WebhooksConfig struct {
	// Endpoints a request may name with Callback-Url (the URL must match an endpoint's
	// pattern) or that the site uses by default.
	Endpoints []EndpointConfig `json:"endpoints,omitempty"`

	// Default names the endpoint used when a request sends no Callback-Url. Its URL must not
	// contain a wildcard. Default: none (no events without Callback-Url).
	Default string `json:"default,omitempty"`

	// Events lists the event types delivered. Default: operation.succeeded, operation.failed,
	// operation.canceled; operation.running may be added.
	Events []string `json:"events,omitempty"`

	// Timeout bounds one delivery attempt. Default: 15s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// MaxAttempts is how many attempts an event gets before it is dead-lettered. Default: 8,
	// which with the default schedule (retries 5s, 5m, 30m, 2h, 5h, 10h and 10h apart, each
	// lengthened by up to 20% of jitter) span more than 27 hours.
	MaxAttempts int `json:"max_attempts,omitempty"`

	// MaxAge dead-letters an event still undelivered this long after it occurred, or after it
	// was last redelivered. Default: 72h.
	MaxAge caddy.Duration `json:"max_age,omitempty"`

	// BreakerFailures consecutive failed attempts open an endpoint's circuit breaker. Default: 5.
	BreakerFailures int `json:"breaker_failures,omitempty"`

	// BreakerCooldown is how long an open breaker waits before one probe. Default: 30s.
	BreakerCooldown caddy.Duration `json:"breaker_cooldown,omitempty"`

	// BackoffMin and BackoffMax, when set, replace the default schedule with exponential
	// backoff between them, with full jitter. Either way a wait is never shorter than the
	// receiver's Retry-After (up to 1h). Default: unset, the schedule above.
	BackoffMin caddy.Duration `json:"backoff_min,omitempty"`
	BackoffMax caddy.Duration `json:"backoff_max,omitempty"`

	// AllowPrivate lets deliveries reach loopback, private, link-local and other
	// special-purpose addresses. Off by default: the address is checked after DNS resolution,
	// at dial time, against SSRF.
	AllowPrivate bool `json:"allow_private,omitempty"`
}

// EndpointConfig is one webhook receiver.
type EndpointConfig struct {
	// Name identifies the endpoint in events, logs, metrics and the admin API.
	Name string `json:"name"`

	// URL is the receiver's URL, or a pattern of them with * standing for any characters of
	// the path (https://consumer.example.com/webhooks/*).
	URL string `json:"url"`

	// Secrets sign every delivery, one signature each (whsec_ and base64, as Standard Webhooks
	// defines); several at once allow rotation. Placeholders such as {env.WHSEC} are expanded.
	// With signature x-webhook a secret is used as written, its bytes the HMAC key.
	Secrets []string `json:"secrets"`

	// Signature is how deliveries to this endpoint are signed: "standard-webhooks" (the
	// default: webhook-id, webhook-timestamp, webhook-signature) or "x-webhook" (X-Webhook-Id,
	// X-Webhook-Timestamp in RFC 3339, X-Webhook-Signature "t=<timestamp>,v1=<hex HMAC-SHA256
	// of t.body>"). Every delivery carries X-Event-Type in both styles.
	Signature string `json:"signature,omitempty"`
}

func (c *WebhooksConfig) setDefaults() {
	if len(c.Events) == 0 {
		c.Events = []string{EventSucceeded, EventFailed, EventCanceled}
	}
	if c.Timeout == 0 {
		c.Timeout = caddy.Duration(webhook.DefaultTimeout)
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = len(webhook.DefaultSchedule) + 1
	}
	if c.MaxAge == 0 {
		c.MaxAge = caddy.Duration(72 * time.Hour)
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = 5
	}
	if c.BreakerCooldown == 0 {
		c.BreakerCooldown = caddy.Duration(30 * time.Second)
	}
}

// retryWait is how long an event waits before retry number retry (0 for the first): the default
// schedule, or exponential backoff when the config sets backoff; never less than retryAfter.
func (h *webhookSetup) retryWait(retry int, retryAfter time.Duration) time.Duration {
	if h.cfg.BackoffMin == 0 {
		return webhook.ScheduledWait(webhook.DefaultSchedule, retry, retryAfter)
	}
	return webhook.Backoff(time.Duration(h.cfg.BackoffMin), time.Duration(h.cfg.BackoffMax), retry, retryAfter)
}

// endpoint is a provisioned endpoint: parsed pattern, signature style and secrets.
type endpoint struct {
	name    string
	pattern *webhook.Pattern
	style   webhook.Style
	secrets []webhook.Secret
}

// hooks is the provisioned webhook configuration.
type webhookSetup struct {
	cfg       WebhooksConfig
	endpoints map[string]*endpoint
	order     []*endpoint
	events    map[string]bool
}

func newWebhookSetup(c *WebhooksConfig, repl *caddy.Replacer) (*webhookSetup, error) {
	h := &webhookSetup{cfg: *c, endpoints: map[string]*endpoint{}, events: map[string]bool{}}
	for _, e := range c.Events {
		switch e {
		case EventSucceeded, EventFailed, EventCanceled, EventRunning,
			batches.EventCompleted, batches.EventFailed, batches.EventExpired, batches.EventCancelled:
			h.events[e] = true
		default:
			return nil, fmt.Errorf("webhooks: unknown event type %q", e)
		}
	}
	if c.MaxAttempts < 1 || c.BreakerFailures < 1 || c.Timeout <= 0 || c.MaxAge <= 0 || c.BreakerCooldown <= 0 || c.BackoffMin < 0 || c.BackoffMax < c.BackoffMin || (c.BackoffMin == 0) != (c.BackoffMax == 0) {
		return nil, fmt.Errorf("webhooks: max_attempts and breaker failures must be at least 1, durations positive, backoff min <= max")
	}
	for _, ec := range c.Endpoints {
		ep, err := newEndpoint(ec, repl)
		if err != nil {
			return nil, err
		}
		if h.endpoints[ep.name] != nil {
			return nil, fmt.Errorf("webhooks: endpoint %q is defined twice", ep.name)
		}
		h.endpoints[ep.name] = ep
		h.order = append(h.order, ep)
	}
	if c.Default != "" {
		ep := h.endpoints[c.Default]
		if ep == nil {
			return nil, fmt.Errorf("webhooks: default endpoint %q is not defined", c.Default)
		}
		if ep.pattern.Wildcard() {
			return nil, fmt.Errorf("webhooks: default endpoint %q has a wildcard URL; give it a concrete URL", c.Default)
		}
	}
	return h, nil
}

func newEndpoint(ec EndpointConfig, repl *caddy.Replacer) (*endpoint, error) {
	if ec.Name == "" {
		return nil, fmt.Errorf("webhooks: an endpoint has no name")
	}
	pattern, err := webhook.ParsePattern(ec.URL)
	if err != nil {
		return nil, fmt.Errorf("webhooks: endpoint %q: %w", ec.Name, err)
	}
	style, err := webhook.ParseStyle(ec.Signature)
	if err != nil {
		return nil, fmt.Errorf("webhooks: endpoint %q: %w", ec.Name, err)
	}
	raws := make([]string, len(ec.Secrets))
	for i, raw := range ec.Secrets {
		raws[i] = repl.ReplaceAll(raw, "")
	}
	secrets, err := webhook.ParseSecrets(style, raws)
	if err != nil {
		return nil, fmt.Errorf("webhooks: endpoint %q: %w", ec.Name, err)
	}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("webhooks: endpoint %q has no secret", ec.Name)
	}
	return &endpoint{name: ec.Name, pattern: pattern, style: style, secrets: secrets}, nil
}

// callbackFor picks the endpoint for a request's Callback-Url (or the default when it has
// none). It reports false when a Callback-Url matches no endpoint.
func (h *webhookSetup) callbackFor(raw string) (*endpoint, string, bool) {
	if raw == "" {
		if h.cfg.Default == "" {
			return nil, "", true
		}
		ep := h.endpoints[h.cfg.Default]
		return ep, ep.pattern.String(), true
	}
	u, ok := webhook.ParseCallback(raw)
	if !ok {
		return nil, "", false
	}
	for _, ep := range h.order {
		if ep.pattern.Matches(u) {
			return ep, u.String(), true
		}
	}
	return nil, "", false
}

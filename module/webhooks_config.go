package module

import (
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/internal/batches"
	"github.com/mulligan-gw/mulligan/internal/courier"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/webhook"
)

// Event types (internal/runner builds and renders the events).
const (
	EventSucceeded = runner.EventSucceeded
	EventFailed    = runner.EventFailed
	EventCanceled  = runner.EventCanceled
	EventRunning   = runner.EventRunning
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

// webhookSetup is a block's webhooks, checked (internal/courier).
type webhookSetup = courier.Setup

// knownEvent reports whether a block may ask for events of type e.
func knownEvent(e string) bool {
	switch e {
	case EventSucceeded, EventFailed, EventCanceled, EventRunning,
		batches.EventCompleted, batches.EventFailed, batches.EventExpired, batches.EventCancelled:
		return true
	}
	return false
}

// newWebhookSetup checks a block's webhooks, its secrets' placeholders expanded by repl.
func newWebhookSetup(c *WebhooksConfig, repl *caddy.Replacer) (*webhookSetup, error) {
	s := courier.Settings{Default: c.Default, Events: c.Events, Timeout: time.Duration(c.Timeout),
		MaxAttempts: c.MaxAttempts, MaxAge: time.Duration(c.MaxAge), BreakerFailures: c.BreakerFailures,
		BreakerCooldown: time.Duration(c.BreakerCooldown), BackoffMin: time.Duration(c.BackoffMin),
		BackoffMax: time.Duration(c.BackoffMax), AllowPrivate: c.AllowPrivate}
	for _, ec := range c.Endpoints {
		secrets := make([]string, len(ec.Secrets))
		for i, raw := range ec.Secrets {
			secrets[i] = repl.ReplaceAll(raw, "")
		}
		s.Endpoints = append(s.Endpoints, courier.EndpointSettings{Name: ec.Name, URL: ec.URL, Secrets: secrets, Signature: ec.Signature})
	}
	return courier.NewSetup(s, knownEvent)
}

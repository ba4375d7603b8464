package courier

import (
	"fmt"
	"time"

	"github.com/mulligan-gw/mulligan/webhook"
)

// Settings are a block's webhook settings (docs/caddyfile.md, webhooks), their defaults set and
// their placeholders expanded.
type Settings struct {
	Endpoints []EndpointSettings
	// Default names the endpoint of a request without Callback-Url ("": none).
	Default string
	// Events are the event types delivered.
	Events []string

	Timeout         time.Duration
	MaxAttempts     int
	MaxAge          time.Duration
	BreakerFailures int
	BreakerCooldown time.Duration
	// BackoffMin and BackoffMax replace the default schedule when set.
	BackoffMin, BackoffMax time.Duration
	AllowPrivate           bool
}

// EndpointSettings is one receiver as declared: a URL or a pattern of them, its secrets and its
// signature style.
type EndpointSettings struct {
	Name      string
	URL       string
	Secrets   []string
	Signature string
}

// Setup is a block's webhooks, checked: the endpoints a request may name, how each is delivered.
type Setup struct {
	Settings Settings
	targets  map[string]*Target
	order    []*Target
}

// Target is one checked endpoint: its name, the URLs it takes, how deliveries to it go.
type Target struct {
	Name    string
	Pattern *webhook.Pattern
	Endpoint
}

// NewSetup checks s, with known the event types a block may ask for.
func NewSetup(s Settings, known func(event string) bool) (*Setup, error) {
	for _, e := range s.Events {
		if !known(e) {
			return nil, fmt.Errorf("webhooks: unknown event type %q", e)
		}
	}
	if s.MaxAttempts < 1 || s.BreakerFailures < 1 || s.Timeout <= 0 || s.MaxAge <= 0 || s.BreakerCooldown <= 0 ||
		s.BackoffMin < 0 || s.BackoffMax < s.BackoffMin || (s.BackoffMin == 0) != (s.BackoffMax == 0) {
		return nil, fmt.Errorf("webhooks: max_attempts and breaker failures must be at least 1, durations positive, backoff min <= max")
	}
	h := &Setup{Settings: s, targets: map[string]*Target{}}
	for _, es := range s.Endpoints {
		t, err := h.target(es)
		if err != nil {
			return nil, err
		}
		if h.targets[t.Name] != nil {
			return nil, fmt.Errorf("webhooks: endpoint %q is defined twice", t.Name)
		}
		h.targets[t.Name] = t
		h.order = append(h.order, t)
	}
	if s.Default != "" {
		t := h.targets[s.Default]
		if t == nil {
			return nil, fmt.Errorf("webhooks: default endpoint %q is not defined", s.Default)
		}
		if t.Pattern.Wildcard() {
			return nil, fmt.Errorf("webhooks: default endpoint %q has a wildcard URL; give it a concrete URL", s.Default)
		}
	}
	return h, nil
}

// target checks one endpoint and sets how it is delivered.
func (h *Setup) target(es EndpointSettings) (*Target, error) {
	if es.Name == "" {
		return nil, fmt.Errorf("webhooks: an endpoint has no name")
	}
	pattern, err := webhook.ParsePattern(es.URL)
	if err != nil {
		return nil, fmt.Errorf("webhooks: endpoint %q: %w", es.Name, err)
	}
	style, err := webhook.ParseStyle(es.Signature)
	if err != nil {
		return nil, fmt.Errorf("webhooks: endpoint %q: %w", es.Name, err)
	}
	secrets, err := webhook.ParseSecrets(style, es.Secrets)
	if err != nil {
		return nil, fmt.Errorf("webhooks: endpoint %q: %w", es.Name, err)
	}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("webhooks: endpoint %q has no secret", es.Name)
	}
	s := h.Settings
	return &Target{Name: es.Name, Pattern: pattern, Endpoint: Endpoint{
		Style: style, Secrets: secrets, Timeout: s.Timeout, AllowPrivate: s.AllowPrivate,
		MaxAge: s.MaxAge, MaxAttempts: s.MaxAttempts,
		Breaker:   Breaker{Failures: uint32(s.BreakerFailures), Cooldown: s.BreakerCooldown},
		RetryWait: h.RetryWait,
	}}, nil
}

// RetryWait is how long an event waits before retry number retry (0 for the first): the default
// schedule, or exponential backoff when the settings set it; never less than retryAfter.
func (h *Setup) RetryWait(retry int, retryAfter time.Duration) time.Duration {
	if h.Settings.BackoffMin == 0 {
		return webhook.ScheduledWait(webhook.DefaultSchedule, retry, retryAfter)
	}
	return webhook.Backoff(h.Settings.BackoffMin, h.Settings.BackoffMax, retry, retryAfter)
}

// Target returns the endpoint named name, nil when the block declares none.
func (h *Setup) Target(name string) *Target { return h.targets[name] }

// CallbackFor picks the endpoint for a request's Callback-Url (or the default when it has
// none), with the URL to deliver to. It reports false when a Callback-Url matches no endpoint.
func (h *Setup) CallbackFor(raw string) (*Target, string, bool) {
	if raw == "" {
		if h.Settings.Default == "" {
			return nil, "", true
		}
		t := h.targets[h.Settings.Default]
		return t, t.Pattern.String(), true
	}
	u, ok := webhook.ParseCallback(raw)
	if !ok {
		return nil, "", false
	}
	for _, t := range h.order {
		if t.Pattern.Matches(u) {
			return t, u.String(), true
		}
	}
	return nil, "", false
}

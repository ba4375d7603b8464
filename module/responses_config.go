package module

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// defaultResponsesRetention is how long a finished background response is kept: OpenAI keeps
// about 10 minutes; a day here, so that an agent that slept through the end still finds it
// (docs/responses.md).
const defaultResponsesRetention = 24 * time.Hour

// ResponsesConfig serves the Responses API's background mode under a prefix
// (docs/responses.md): POST {prefix}/responses with background true becomes a durable
// operation, retrieved, streamed, cancelled and deleted under {prefix}/responses/{id}.
type ResponsesConfig struct {
	// Prefix is where the API is served: {prefix}/responses. Example: /v1.
	Prefix string `json:"prefix,omitempty"`
	// Retention is how long a finished response is kept; then it answers 404. Default: 24h.
	Retention caddy.Duration `json:"retention,omitempty"`
	// Urgency is the RFC 9218 urgency (0 most urgent to 7) background responses wait at for an
	// upstream seat, unless the request's Priority header says otherwise. Default: the
	// request's Priority, else 3, as any operation.
	Urgency *int `json:"urgency,omitempty"`
	// Timeout bounds one upstream execution of a response. Default: the async timeout.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// MaxResult is the largest recorded answer (the whole event stream), in bytes; a response
	// whose answer passes it fails RESULT_TOO_LARGE. Default: the async max_result.
	MaxResult int64 `json:"max_result,omitempty"`
}

func (c *ResponsesConfig) setDefaults(async *AsyncConfig) {
	if c == nil {
		return
	}
	c.Prefix = strings.TrimRight(c.Prefix, "/")
	if c.Retention == 0 {
		c.Retention = caddy.Duration(defaultResponsesRetention)
	}
	if c.Timeout == 0 {
		c.Timeout = async.Timeout
	}
	if c.MaxResult == 0 {
		c.MaxResult = async.MaxResult
	}
}

func (c *ResponsesConfig) validate() error {
	if c == nil {
		return nil
	}
	switch {
	case !strings.HasPrefix(c.Prefix, "/") || strings.ContainsAny(c.Prefix, "*?#{} "):
		return fmt.Errorf("responses must name a plain path prefix such as /v1, got %q", c.Prefix)
	case c.Urgency != nil && (*c.Urgency < 0 || *c.Urgency > 7):
		return fmt.Errorf("responses: urgency must be from 0 to 7, got %d", *c.Urgency)
	case c.Retention < 0 || c.Timeout < 0 || c.MaxResult < 0:
		return fmt.Errorf("responses: retention, timeout and max_result must be positive")
	}
	return nil
}

// path is where responses are created.
func (c *ResponsesConfig) path() string { return c.Prefix + "/responses" }

// covers reports whether path belongs to the Responses API.
func (c *ResponsesConfig) covers(path string) bool {
	return c != nil && (path == c.path() || strings.HasPrefix(path, c.path()+"/"))
}

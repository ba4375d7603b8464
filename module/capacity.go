package module

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/internal/capacity"
)

// CapacityConfig bounds the calls this block sends upstream to the model server's real seats,
// and orders the work waiting for one (docs/capacity.md). Without it, calls go upstream as they
// come and operations run `concurrency` at a time, as before.
type CapacityConfig struct {
	// Limit is how many calls this replica sends upstream at once (covered sync calls and
	// operation attempts together). Zero with Auto set: the limit adapts between Min and Max.
	Limit int `json:"limit,omitempty"`

	// Auto adapts the limit to the upstream: it grows while latency stays at its floor and is
	// cut when latency rises (a queue forming inside the model server) or the upstream answers
	// 429 or 503 or times out.
	Auto bool `json:"auto,omitempty"`

	// Min and Max bound an adaptive limit. Defaults: 1 and 64. Under Shared the limit adapts
	// no lower than Shared (nor above Max): docs/capacity.md, "Sizing limit against shared".
	Min int `json:"min,omitempty"`
	Max int `json:"max,omitempty"`

	// Shared, with PostgreSQL storage, bounds the calls in flight from every replica on that
	// storage together; a dead replica's seats come back after `takeover`. Zero: no bound
	// across replicas.
	Shared int `json:"shared,omitempty"`

	// Wait is the longest a sync call waits for a seat; then it is answered 202 if it may become
	// an operation, else 503 UPSTREAM_SATURATED. A shorter Prefer: wait=N applies per request.
	// Default: 30s.
	Wait caddy.Duration `json:"wait,omitempty"`

	// FairKey is the fairness key the seats are shared by: a placeholder such as
	// {http.request.header.X-Tenant} set by the operator's auth layer. Default: the caller's
	// scope.
	FairKey string `json:"fair_key,omitempty"`

	// Classes are requests the operator trusts with an urgency across tenants, or gives a
	// weight; the first whose header matches applies.
	Classes []CapacityClass `json:"classes,omitempty"`

	// ServerMetrics, with limit auto, steers the limit by the model server's own saturation
	// read from its Prometheus endpoint, latency standing in while they are stale.
	ServerMetrics *ServerMetricsConfig `json:"server_metrics,omitempty"`

	// MaxQueueWait is the longest an operation may wait in the queue: past it, it fails
	// QUEUE_TIMEOUT without reaching the upstream. A request may ask for less with the
	// Max-Queue-Wait header. Zero: no bound.
	MaxQueueWait caddy.Duration `json:"max_queue_wait,omitempty"`

	// PassPriority, "vllm" or "sglang", sets the top-level "priority" field of a JSON body
	// sent upstream to the trusted urgency in that server's scale (docs/capacity.md, Passing
	// urgency upstream). Empty: the body goes as the client sent it.
	PassPriority string `json:"pass_priority,omitempty"`
}

// Capacity defaults (docs/caddyfile.md).
const (
	defaultCapacityWait = 30 * time.Second
	defaultAutoMin      = 1
	defaultAutoMax      = 64
)

func (c *CapacityConfig) setDefaults() {
	if c.Wait == 0 {
		c.Wait = caddy.Duration(defaultCapacityWait)
	}
	if c.Limit == 0 && !c.Auto {
		c.Auto = true
	}
	if c.ServerMetrics != nil {
		c.ServerMetrics.setDefaults()
	}
	if c.Auto {
		if c.Min == 0 {
			c.Min = defaultAutoMin
		}
		if c.Max == 0 {
			c.Max = defaultAutoMax
		}
	}
}

func (c *CapacityConfig) validate() error {
	switch {
	case c.Auto && c.Limit != 0:
		return fmt.Errorf("capacity: limit is either a number or auto <min> <max>, not both")
	case c.Auto && (c.Min < 1 || c.Max < c.Min):
		return fmt.Errorf("capacity: limit auto needs 1 <= min <= max, got %d %d", c.Min, c.Max)
	case !c.Auto && c.Limit < 1:
		return fmt.Errorf("capacity: limit must be at least 1, got %d", c.Limit)
	case c.Shared < 0 || c.Wait < 0 || c.MaxQueueWait < 0:
		return fmt.Errorf("capacity: shared, wait and max_queue_wait must not be negative")
	}
	if c.ServerMetrics != nil {
		if err := c.ServerMetrics.validate(c.Auto); err != nil {
			return err
		}
	}
	if !capacity.ValidPassPriority(c.PassPriority) {
		return fmt.Errorf("capacity: pass_priority must be vllm or sglang, got %q", c.PassPriority)
	}
	if err := capacity.ValidateFairKey(c.FairKey); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i := range c.Classes {
		if err := c.Classes[i].Validate(); err != nil {
			return err
		}
		if seen[c.Classes[i].Name] {
			return fmt.Errorf("capacity: class %q is defined twice", c.Classes[i].Name)
		}
		seen[c.Classes[i].Name] = true
	}
	return nil
}

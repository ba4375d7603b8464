package module

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/store"
)

// CapacityClass is a class of requests whose urgency the operator trusts across tenants, or
// whose fairness key weighs more (docs/capacity.md, "Fairness"). A request is of the first class
// whose header matches.
type CapacityClass struct {
	// Name names the class in errors and docs.
	Name string `json:"name"`
	// Header is the request header that puts a request in the class: set by the operator's auth
	// layer, not by the caller (the gateway cannot tell who set it).
	Header string `json:"header"`
	// Value is the header's value the class matches; "" or "*": any value.
	Value string `json:"value,omitempty"`
	// Urgency, when set (0..7), is the class's urgency, trusted across tenants: it replaces the
	// request's own Priority in the order.
	Urgency *int `json:"urgency,omitempty"`
	// Weight is the share of seats of each fairness key of the class against weight-1 keys when
	// they wait together. Default: 1.
	Weight float64 `json:"weight,omitempty"`
}

// matches reports whether r is of the class.
func (c *CapacityClass) matches(r *http.Request) bool {
	v, ok := r.Header[http.CanonicalHeaderKey(c.Header)]
	if !ok {
		return false
	}
	return c.Value == "" || c.Value == "*" || len(v) > 0 && v[0] == c.Value
}

func (c *CapacityClass) validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("capacity: a class needs a name")
	case c.Header == "" || strings.ContainsAny(c.Header, " \t:{}"):
		return fmt.Errorf("capacity: class %q needs a header field name to match, got %q", c.Name, c.Header)
	case c.Urgency != nil && (*c.Urgency < store.MostUrgent || *c.Urgency > store.LeastUrgent):
		return fmt.Errorf("capacity: class %q: urgency must be from 0 to 7, got %d", c.Name, *c.Urgency)
	case c.Weight != 0 && (c.Weight < 1 || c.Weight > maxClassWeight):
		return fmt.Errorf("capacity: class %q: weight must be from 1 to %d, got %v", c.Name, maxClassWeight, c.Weight)
	}
	return nil
}

// maxClassWeight bounds a class's weight: past it, the other keys would wait for ever in practice.
const maxClassWeight = 1000

// maxFairKey bounds a fairness key's length: a longer header value is cut, never refused.
const maxFairKey = 256

// validateFairKey checks a fair_key: a placeholder, or text with placeholders, whose braces pair.
func validateFairKey(key string) error {
	if key == "" {
		return nil
	}
	depth, placeholders := 0, 0
	for _, c := range key {
		switch {
		case c == '{':
			depth++
		case c == '}' && depth == 0:
			depth = -1
		case c == '}':
			depth--
			placeholders++
		}
		if depth < 0 {
			break
		}
	}
	if depth != 0 || placeholders == 0 {
		return fmt.Errorf("capacity: fair_key must be a placeholder such as {http.request.header.X-Tenant}, got %q", key)
	}
	return nil
}

// ask is a live request's place in the order: its class's trusted urgency and weight, or its
// own Priority (trusted only to order its own key's work), and its fairness key.
func (c *CapacityConfig) ask(r *http.Request, scope string, now time.Time) seatAsk {
	a := seatAsk{Urgency: capacity.UrgencyOf(r.Header.Values("Priority")), Scope: scope, Since: now}
	if c == nil {
		return a
	}
	a.Key = c.fairKeyOf(r)
	for i := range c.Classes {
		cl := &c.Classes[i]
		if !cl.matches(r) {
			continue
		}
		if cl.Urgency != nil {
			a.Urgency, a.Trusted = *cl.Urgency, true
		}
		a.Weight = cl.Weight
		break
	}
	return a
}

// fairKeyOf is r's fairness key: fair_key with its placeholders replaced; "" (the scope) without
// one, or when it comes out empty. It is kept apart from scopes, and bounded.
func (c *CapacityConfig) fairKeyOf(r *http.Request) string {
	if c.FairKey == "" {
		return ""
	}
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		return ""
	}
	k := repl.ReplaceAll(c.FairKey, "")
	if k == "" {
		return ""
	}
	if len(k) > maxFairKey {
		k = k[:maxFairKey]
	}
	return "key:" + k
}

// storedUrgency is the urgency an operation waits at in the durable queue, where it competes
// with every tenant's: its urgency when trusted, else no more urgent than the default.
func storedUrgency(a seatAsk) int {
	u := store.ClampUrgency(a.Urgency)
	if !a.Trusted {
		u = max(u, store.DefaultUrgency)
	}
	return u
}

// queueAsk is what an operation of kr keeps of its place in the order: the urgency it waits at
// across tenants, its fairness key and weight. Without capacity, the request's own urgency.
func (c *converter) queueAsk(kr *keyedRequest, now time.Time) (urgency int, key string, weight float64) {
	if c.capacity == nil {
		return capacity.UrgencyOf(kr.r.Header.Values("Priority")), "", 0
	}
	a := c.capacity.ask(kr.r, kr.scope, now)
	return storedUrgency(a), a.Key, a.Weight
}

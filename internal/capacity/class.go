package capacity

import (
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/mulligan-gw/mulligan/store"
)

// Class is a class of requests whose urgency the operator trusts across tenants, or whose
// fairness key weighs more (docs/capacity.md, "Fairness"). A request is of the first class
// whose header matches.
type Class struct {
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
	// Weight is the share of slot time of each fairness key of the class against weight-1 keys
	// when they wait together. Default: 1.
	Weight float64 `json:"weight,omitempty"`
}

// Matches reports whether a request with header h is of the class.
func (c *Class) Matches(h http.Header) bool {
	v, ok := h[http.CanonicalHeaderKey(c.Header)]
	if !ok {
		return false
	}
	return c.Value == "" || c.Value == "*" || len(v) > 0 && v[0] == c.Value
}

// Validate refuses a class that does not parse: a load error.
func (c *Class) Validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("capacity: a class needs a name")
	case c.Header == "" || strings.ContainsAny(c.Header, " \t:{}"):
		return fmt.Errorf("capacity: class %q needs a header field name to match, got %q", c.Name, c.Header)
	case c.Urgency != nil && (*c.Urgency < store.MostUrgent || *c.Urgency > store.LeastUrgent):
		return fmt.Errorf("capacity: class %q: urgency must be from 0 to 7, got %d", c.Name, *c.Urgency)
	case c.Weight != 0 && !(c.Weight >= 1 && c.Weight <= MaxClassWeight): // NaN too
		return fmt.Errorf("capacity: class %q: weight must be from 1 to %d, got %v", c.Name, MaxClassWeight, c.Weight)
	}
	return nil
}

// Apply puts a, the ask of a request of the class, at the class's trusted urgency and weight.
func (c *Class) Apply(a Ask) Ask {
	if c.Urgency != nil {
		a.Urgency, a.Trusted = *c.Urgency, true
	}
	a.Weight = c.Weight
	return a
}

// MaxClassWeight bounds a class's weight: past it, the other keys would wait for ever in practice.
const MaxClassWeight = 1000

// maxFairKey bounds a fairness key's length: a longer value is cut, never refused.
const maxFairKey = 256

// ValidateFairKey checks a fair_key: a placeholder, or text with placeholders, whose braces pair.
func ValidateFairKey(key string) error {
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

// FairKey is the fairness key of a request whose fair_key came out as k: "" (the scope) when it
// came out empty, else kept apart from scopes, bounded, and text any storage keeps as it is
// (valid UTF-8 without NUL: a header's or a query's bytes may be neither, and PostgreSQL refuses
// them in a text column).
func FairKey(k string) string {
	k = store.LaneText(k)
	if k == "" {
		return ""
	}
	if len(k) > maxFairKey {
		n := maxFairKey
		for n > 0 && !utf8.RuneStart(k[n]) {
			n--
		}
		k = k[:n]
	}
	return "key:" + k
}

// StoredLift is how many levels more urgent than Stored a asks for its own work (store.Operation.Lift):
// an untrusted Priority above the default, which orders its own key's work only.
func (a Ask) StoredLift() int { return max(a.Stored()-store.ClampUrgency(a.Urgency), 0) }

// Stored is the urgency a's work waits at where it competes with every tenant's (the durable
// queue, the model server's own priority): its urgency when trusted, else no more urgent than
// the default.
func (a Ask) Stored() int {
	u := store.ClampUrgency(a.Urgency)
	if !a.Trusted {
		u = max(u, store.DefaultUrgency)
	}
	return u
}

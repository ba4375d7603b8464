package module

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/internal/capacity"
)

// CapacityClass is a class of requests whose urgency the operator trusts across tenants, or
// whose fairness key weighs more (internal/capacity).
type CapacityClass = capacity.Class

// ask is a live request's place in the order: its class's trusted urgency and weight, or its
// own Priority (trusted only to order its own key's work), and its fairness key.
func (c *CapacityConfig) ask(r *http.Request, scope string, now time.Time) seatAsk {
	a := seatAsk{Urgency: capacity.UrgencyOf(r.Header.Values("Priority")), Scope: scope, Since: now}
	if c == nil {
		return a
	}
	a.Key = c.fairKeyOf(r)
	for i := range c.Classes {
		if cl := &c.Classes[i]; cl.Matches(r.Header) {
			return cl.Apply(a)
		}
	}
	return a
}

// fairKeyOf is r's fairness key: fair_key with its placeholders replaced (capacity.FairKey).
func (c *CapacityConfig) fairKeyOf(r *http.Request) string {
	if c.FairKey == "" {
		return ""
	}
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		return ""
	}
	return capacity.FairKey(repl.ReplaceAll(c.FairKey, ""))
}

// queueAsk is what an operation of kr keeps of its place in the order: the urgency it waits at
// across tenants, how much more its caller asked for its own work (store.Operation.Lift: an
// untrusted Priority above the default), its fairness key and weight. Without capacity there are
// no classes to trust and no fairness key: the request's Priority, untrusted, and its scope.
func (c *converter) queueAsk(kr *keyedRequest, now time.Time) (urgency, lift int, key string, weight float64) {
	a := capacity.Ask{Urgency: capacity.UrgencyOf(kr.r.Header.Values("Priority"))}
	if c.capacity != nil {
		a = c.capacity.ask(kr.r, kr.scope, now)
	}
	return a.Stored(), a.StoredLift(), a.Key, a.Weight
}

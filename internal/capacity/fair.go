package capacity

import (
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// Fairness between the keys that wait for seats (docs/capacity.md, "Fairness"): start-time fair
// queuing over seats. Each fairness key waiting has a virtual start, the virtual time of its
// next turn; a grant goes to the key with the earliest start, which then moves on by 1/weight.
// A key that starts to wait (new, or back after it had nothing waiting) starts no earlier than
// the latest start of the keys already waiting: behind every waiting key's next turn, as deficit
// round robin puts a new flow at the tail, so neither a new identity per call nor going idle
// buys a place ahead of a tenant's backlog. Urgency counts across keys only where it is trusted
// (band); a caller's own Priority orders its own key's work.

// keyTurn is one waiting key's place in the turns.
type keyTurn struct {
	start   float64 // the virtual time of its next turn
	weight  float64 // its share against weight-1 keys
	waiting int     // its waiters in the pool
}

// keyOf is the fairness key of an ask: Key, or the scope when none is set.
func keyOf(a Ask) string {
	if a.Key != "" {
		return a.Key
	}
	return a.Scope
}

// weightOf is an ask's weight: at least 1 (a weight below, or none, is 1).
func weightOf(a Ask) float64 { return max(a.Weight, 1) }

// band is the urgency an ask competes at against other keys: its own when trusted (an operator's
// class, or the gateway's own work), else no more urgent than the default: a caller may lower its
// own standing, never raise it above another tenant's (RFC 9218 §10). Waiting raises a band less
// urgent than the default as the durable queue does (store.EffectiveUrgency).
func band(a Ask, now time.Time) int { return a.Band(now) }

// Band is the urgency a competes at against other keys at now (band).
func (a Ask) Band(now time.Time) int {
	u := store.ClampUrgency(a.Urgency)
	if !a.Trusted {
		u = max(u, store.DefaultUrgency)
	}
	return store.EffectiveUrgency(u, now.Sub(a.Since))
}

// joinLocked counts a waiter of a's key, starting a key that had none at the current virtual
// time or behind the waiting keys' next turns, whichever is later.
func (p *Pool) joinLocked(a Ask) {
	k := keyOf(a)
	t := p.keys[k]
	if t == nil {
		start := p.vtime
		for _, o := range p.keys {
			start = max(start, o.start)
		}
		t = &keyTurn{start: start}
		p.keys[k] = t
	}
	t.weight = weightOf(a)
	t.waiting++
}

// leaveLocked uncounts a waiter of a's key; granted, the key's turn moves on. A key with nobody
// waiting is forgotten, so the map holds only the keys waiting (keys are as many as callers).
func (p *Pool) leaveLocked(a Ask, granted bool) {
	k := keyOf(a)
	t := p.keys[k]
	if t == nil {
		return
	}
	if granted {
		p.vtime = max(p.vtime, t.start)
		t.start = max(t.start, p.vtime) + 1/t.weight
	}
	if t.waiting--; t.waiting <= 0 {
		delete(p.keys, k)
	}
}

// before reports whether waiter a is served before b: the more urgent band, then the key whose
// turn comes first, then (within a key) the caller's own urgency, then the oldest.
func (p *Pool) before(a, b *Waiter, now time.Time) bool {
	if ba, bb := band(a.Ask, now), band(b.Ask, now); ba != bb {
		return ba < bb
	}
	ka, kb := keyOf(a.Ask), keyOf(b.Ask)
	if ka != kb {
		if sa, sb := p.startOf(ka), p.startOf(kb); sa != sb {
			return sa < sb
		}
	} else if ua, ub := effectiveUrgency(a.Ask, now), effectiveUrgency(b.Ask, now); ua != ub {
		return ua < ub
	}
	return a.Ask.Since.Before(b.Ask.Since)
}

func (p *Pool) startOf(key string) float64 {
	if t := p.keys[key]; t != nil {
		return t.start
	}
	return p.vtime
}

package capacity

import (
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// Fairness between the keys that wait for seats (docs/capacity.md, "Fairness"): start-time fair
// queuing over seats. Each fairness key waiting has a virtual start, the virtual time of its
// next turn; a grant goes to the key with the earliest start, which then moves on by 1/weight.
// Keys not served lately share one lane (newcomers).
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

// newcomers is the lane of the keys the pool has not served lately: they take one turn
// between them, so a fresh identity per call (a minted credential) competes with a known
// tenant's backlog as one key, however many identities it mints.
const newcomers = "\x00newcomers"

// knownKeys bounds how many keys served lately the pool remembers: past it, it forgets the half
// served longest ago (they come back as newcomers).
const knownKeys = 4096

// laneOf is the lane a's key waits in: its own when it is waiting already or was served lately,
// else the newcomers'.
func (p *Pool) laneOf(a Ask) string {
	k := keyOf(a)
	if _, waiting := p.keys.of[k]; waiting {
		return k
	}
	if _, ok := p.known[k]; ok {
		return k
	}
	return newcomers
}

// joinLocked counts waiter w in its lane (and, among the newcomers, under its key), starting a
// lane or key that had none at the current virtual time or behind the waiting ones' next turns,
// whichever is later.
func (p *Pool) joinLocked(w *Waiter) {
	w.lane = p.laneOf(w.Ask)
	weight := 1.0
	if w.lane != newcomers {
		weight = weightOf(w.Ask)
	}
	p.keys.join(w.lane, weight)
	if w.lane == newcomers {
		p.newKeys.join(keyOf(w.Ask), weightOf(w.Ask))
	}
}

// leaveLocked uncounts waiter w; granted, its lane's (and key's) turn moves on and its key counts
// as known. What has nobody waiting is forgotten, so the maps hold only what waits.
func (p *Pool) leaveLocked(w *Waiter, granted bool) {
	p.keys.leave(w.lane, granted)
	if w.lane == newcomers {
		p.newKeys.leave(keyOf(w.Ask), granted)
	}
	if granted {
		p.knowLocked(keyOf(w.Ask))
	}
}

// turns are the virtual starts of what waits: lanes, or the newcomers' keys within their lane.
type turns struct {
	of    map[string]*keyTurn
	vtime float64 // the start of the latest turn granted
}

func newTurns() turns { return turns{of: map[string]*keyTurn{}} }

func (ts *turns) join(k string, weight float64) {
	t := ts.of[k]
	if t == nil {
		start := ts.vtime
		for _, o := range ts.of {
			start = max(start, o.start)
		}
		t = &keyTurn{start: start}
		ts.of[k] = t
	}
	t.weight = weight
	t.waiting++
}

func (ts *turns) leave(k string, granted bool) {
	t := ts.of[k]
	if t == nil {
		return
	}
	if granted {
		ts.vtime = max(ts.vtime, t.start)
		t.start = max(t.start, ts.vtime) + 1/t.weight
	}
	if t.waiting--; t.waiting <= 0 {
		delete(ts.of, k)
	}
}

func (ts *turns) startOf(k string) float64 {
	if t := ts.of[k]; t != nil {
		return t.start
	}
	return ts.vtime
}

// knowLocked notes key as served now, forgetting the half served longest ago past knownKeys.
func (p *Pool) knowLocked(key string) {
	p.served++
	p.known[key] = p.served
	if len(p.known) <= knownKeys {
		return
	}
	cut := p.served - knownKeys/2
	for k, at := range p.known {
		if at <= cut {
			delete(p.known, k)
		}
	}
}

// before reports whether waiter a is served before b: the more urgent band, then the lane whose
// turn comes first, among newcomers the key whose turn comes first, then (within a key) the
// caller's own urgency, then the oldest.
func (p *Pool) before(a, b *Waiter, now time.Time) bool {
	if ba, bb := band(a.Ask, now), band(b.Ask, now); ba != bb {
		return ba < bb
	}
	if a.lane != b.lane {
		if sa, sb := p.keys.startOf(a.lane), p.keys.startOf(b.lane); sa != sb {
			return sa < sb
		}
	}
	ka, kb := keyOf(a.Ask), keyOf(b.Ask)
	if a.lane == newcomers && b.lane == newcomers && ka != kb {
		if sa, sb := p.newKeys.startOf(ka), p.newKeys.startOf(kb); sa != sb {
			return sa < sb
		}
	}
	if ka == kb {
		if ua, ub := effectiveUrgency(a.Ask, now), effectiveUrgency(b.Ask, now); ua != ub {
			return ua < ub
		}
	}
	return a.Ask.Since.Before(b.Ask.Since)
}

package capacity

import (
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// Fairness between the keys that wait for seats (docs/capacity.md, "Fairness"): start-time fair
// queuing over slot time. Each fairness key waiting has a virtual start, the virtual time of its
// next turn; a grant goes to the key with the earliest start, which then moves on by the slot
// time the call is expected to hold over the key's weight, corrected to the time it held once
// its seat comes back. So a tenant of short calls gets as many turns as its calls' slot time
// earns against a tenant of long ones, not one call for each of theirs, and a weight-2 key gets
// twice the slot time of a weight-1 key.
//
// A key that starts to wait starts at the current virtual time (the start of the latest turn
// granted), or later when its own last turn ended later: going idle banks no turns, and the
// finish a key leaves is kept while the key is remembered as served lately. Keys not served
// lately share one lane (newcomers), in which each key starts behind the keys already waiting:
// a new identity per call buys no place ahead of anyone's backlog. Urgency counts across keys
// only where it is trusted (band); a caller's own Priority orders its own key's work.

// keyTurn is one waiting key's place in the turns.
type keyTurn struct {
	start   time.Duration // the virtual time of its next turn
	weight  float64       // its share against weight-1 keys
	waiting int           // its waiters in the pool
}

// knownKey is a key served lately: when (a count of grants), where its last turn ended, and
// the slot time its calls held lately.
type knownKey struct {
	served uint64        // the pool's count of seats served when it was served last
	grants int           // seats it was served, up to 2: keys served once are forgotten first
	finish time.Duration // the virtual start its next turn would have
	hold   time.Duration // a moving average; 0: not measured yet
}

// Slot time as turns charge it. Virtual time is a time.Duration, so that equal charges make
// exact ties (broken by age) rather than rounding noise.
const (
	// defaultHold is charged for a call of a key whose calls were never measured, until the
	// pool has measured any.
	defaultHold = time.Second
	// minCharge is the least a turn costs, so that calls answered at once (or seats never used)
	// still take turns.
	minCharge = time.Millisecond
	// holdWeight is how much the latest call moves a moving average of slot time.
	holdWeight = 0.2
	// holdSampleCap bounds how many times the average one call counts as, so that one very
	// long stream does not charge every key for the next calls as if theirs were as long.
	holdSampleCap = 10
	// rebaseAt is the virtual time past which the turns are moved back to start near zero,
	// long before a time.Duration would wrap (virtual time runs as fast as all the seats
	// together: at 1,000 seats, about 36 years of it in 13 days).
	rebaseAt = time.Duration(1) << 60
)

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

// knownKeys bounds how many keys served lately the pool remembers: past it, it forgets the keys
// served once, all but the latest quarter, or when they are too few, the half of all served
// longest ago (they come back as newcomers; knowLocked).
const knownKeys = 4096

// laneOf is the lane a's key waits in: its own when it is waiting already or was served lately,
// else the newcomers'. A new key's calls that waited before it was served stay among the
// newcomers: until they are served, such a burst takes the newcomers' turns and its own lane's
// (docs/capacity.md, "Not there yet").
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

// laneWeight is the weight w's lane takes turns with: its key's, or 1 for the newcomers'.
func laneWeight(w *Waiter) float64 {
	if w.lane == newcomers {
		return 1
	}
	return weightOf(w.Ask)
}

// joinLocked counts waiter w in its lane (and, among the newcomers, under its key), starting a
// lane that had nobody waiting at the current virtual time or where its last turn ended,
// whichever is later, and a newcomer key behind the newcomers' keys waiting.
func (p *Pool) joinLocked(w *Waiter) {
	w.lane = p.laneOf(w.Ask)
	floor := p.newcomersFinish
	if k := p.known[w.lane]; k != nil {
		floor = k.finish
	}
	p.keys.join(w.lane, laneWeight(w), floor)
	if w.lane == newcomers {
		p.newKeys.join(keyOf(w.Ask), weightOf(w.Ask), 0)
	}
}

// leaveLocked uncounts waiter w. Granted, its lane's (and key's) turn moves on by the slot time
// calls are expected to hold (chargeOf), its key counts as served, and its lane's new start is
// kept as where its last turn ended. What has nobody waiting leaves the turns, so they hold only
// what waits.
func (p *Pool) leaveLocked(w *Waiter, granted bool) {
	k := keyOf(w.Ask)
	if granted {
		w.charged = p.chargeOf(w)
		var finish time.Duration
		finish, w.laneW = p.keys.grant(w.lane, w.charged)
		kk := p.knowLocked(k)
		if w.lane == newcomers {
			_, w.keyW = p.newKeys.grant(k, w.charged)
			p.newcomersFinish = finish
			kk.finish = max(kk.finish, finish) // a turn of its own lane, when it has one, stands
		} else {
			kk.finish = finish
		}
		p.rebaseLocked()
	}
	p.keys.leave(w.lane)
	if w.lane == newcomers {
		p.newKeys.leave(k)
		if granted {
			p.moveBurstLocked(k)
		}
	}
}

// moveBurstLocked moves key k's calls still waiting among the newcomers to k's own lane, k
// having just been served there: a new key's burst then holds one lane, not the newcomers'
// turns and its own lane's (its later calls wait in its lane, as a key served lately). The lane
// starts just behind the newcomers' next turn: the new key waiting there longest goes before the
// burst's second call; the newcomers' lane and the burst's then take turns, as any two lanes.
func (p *Pool) moveBurstLocked(k string) {
	var moved []*Waiter
	for _, x := range p.waiting {
		if x.lane == newcomers && keyOf(x.Ask) == k {
			moved = append(moved, x)
		}
	}
	if len(moved) == 0 {
		return
	}
	floor := p.keys.startOf(newcomers) + 1
	if kk := p.known[k]; kk != nil {
		floor = max(floor, kk.finish)
	}
	for _, x := range moved {
		p.keys.leave(newcomers)
		p.newKeys.leave(k)
		x.lane = k
		p.keys.join(k, laneWeight(x), floor)
	}
}

// chargeOf is what a grant to waiter w charges its turn before the call's time is known: the
// slot time calls held lately, its key's when longer, and among the newcomers the newcomers'
// when longer still. Never less than the pool's, weighted by slot time (a seat is mostly held
// by long calls, however many short ones there are): a key whose calls were short lately and
// then sends long ones pays that for each seat it takes until they end, not its own short
// average (it could otherwise take every seat at once), and fresh identities sending long calls
// pay what their lane's calls held.
func (p *Pool) chargeOf(w *Waiter) time.Duration {
	c := p.hold
	if kk := p.known[keyOf(w.Ask)]; kk != nil {
		c = max(c, kk.hold)
	}
	if w.lane == newcomers {
		c = max(c, p.newcomersHold)
	}
	return c
}

// slotAverage is a moving average of the slot time calls held, weighted by it: the sum of the
// times and of their squares, each moved holdWeight towards the latest call (in seconds).
type slotAverage struct{ sum, squares float64 }

// add counts a call that held its seat for took and returns the average.
func (a *slotAverage) add(took time.Duration) time.Duration {
	s := took.Seconds()
	a.sum += holdWeight * (s - a.sum)
	a.squares += holdWeight * (s*s - a.squares)
	return time.Duration(a.squares / a.sum * float64(time.Second))
}

// movedAverage is average moved holdWeight towards took, took counting as no more than
// holdSampleCap times the average (0: none yet, took is the average).
func movedAverage(average, took time.Duration) time.Duration {
	if average == 0 {
		return took
	}
	return average + per(min(took, holdSampleCap*average)-average, 1/holdWeight)
}

// rebaseLocked moves the turns back near zero once virtual time passes rebaseAt: every start
// and remembered finish less the same amount keeps the order.
func (p *Pool) rebaseLocked() {
	if p.keys.vtime > rebaseAt {
		// A finish behind the virtual time counts as the virtual time when its key comes back:
		// at zero, stale ones stay bounded however many rebases they see.
		base := p.keys.rebase()
		p.newcomersFinish = max(p.newcomersFinish-base, 0)
		for _, kk := range p.known {
			kk.finish = max(kk.finish-base, 0)
		}
	}
	if p.newKeys.vtime > rebaseAt {
		p.newKeys.rebase()
	}
}

// settleLocked corrects the turn of granted waiter w to the slot time its seat held (zero when
// it was never used for a call, which then costs the least a turn does): a call that held its
// seat longer than its key's calls lately moves the key's turns on further, a shorter one brings
// them back. A used seat's time also teaches the key's and the pool's averages.
func (p *Pool) settleLocked(w *Waiter, held time.Duration, used bool) {
	if w == nil || !w.granted || w.settled {
		return
	}
	w.settled = true
	delete(p.running, w)
	took := max(held, minCharge)
	if !used {
		took = minCharge
	}
	kk := p.chargeLocked(w, took-w.charged-w.toppedUp)
	if !used {
		return
	}
	p.hold = p.slot.add(min(took, holdSampleCap*p.hold))
	if w.lane == newcomers {
		p.newcomersHold = movedAverage(p.newcomersHold, took)
	}
	if kk != nil {
		kk.hold = movedAverage(kk.hold, took)
	}
}

// chargeLocked moves the turns of granted waiter w's lane (and key) by d, what its call cost
// beyond what they were charged so far (negative: a refund), and returns its key's record.
func (p *Pool) chargeLocked(w *Waiter, d time.Duration) *knownKey {
	k := keyOf(w.Ask)
	delta := per(d, w.laneW)
	p.keys.settle(w.lane, delta)
	if w.lane == newcomers {
		p.newKeys.settle(k, per(d, w.keyW))
		p.newcomersFinish += delta
		// Its key's own lane, when it has one since, started where this grant left it.
		p.keys.settle(k, per(d, w.keyW))
	}
	kk := p.known[k]
	if kk != nil {
		kk.finish += delta
	}
	return kk
}

// topUpLocked charges the calls still running the time they have held their seats beyond what
// their grants charged, before seats are granted at now: a burst of calls longer than the
// averages pays as it goes, not only once each ends, so it cannot keep taking seats while the
// first of it runs (what it was charged is corrected at the end as ever).
func (p *Pool) topUpLocked(now time.Time) {
	for w := range p.running {
		if over := now.Sub(w.grantedAt) - w.charged - w.toppedUp; over > 0 {
			w.toppedUp += over
			p.chargeLocked(w, over)
		}
	}
}

// per is d over weight w.
func per(d time.Duration, w float64) time.Duration { return time.Duration(float64(d) / w) }

// turns are the virtual starts of what waits: lanes, or the newcomers' keys within their lane.
type turns struct {
	of    map[string]*keyTurn
	vtime time.Duration // the start of the latest turn granted
	// behind: a key that starts to wait starts no earlier than the next turns of the keys
	// waiting (the newcomers' keys, which are not remembered between calls).
	behind bool
}

func newTurns(behind bool) turns { return turns{of: map[string]*keyTurn{}, behind: behind} }

// join counts a waiter of k; a k with nobody waiting starts at the virtual time, or at floor
// when later (and behind the waiting keys with behind).
func (ts *turns) join(k string, weight float64, floor time.Duration) {
	t := ts.of[k]
	if t == nil {
		start := max(ts.vtime, floor)
		if ts.behind {
			for _, o := range ts.of {
				start = max(start, o.start)
			}
		}
		t = &keyTurn{start: start}
		ts.of[k] = t
	}
	t.weight = weight
	t.waiting++
}

// grant moves k's turn on by charge (slot time) over its weight and returns its new start and
// the weight.
func (ts *turns) grant(k string, charge time.Duration) (time.Duration, float64) {
	t := ts.of[k]
	if t == nil {
		return ts.vtime, 1
	}
	ts.vtime = max(ts.vtime, t.start)
	t.start = max(t.start, ts.vtime) + per(charge, t.weight)
	return t.start, t.weight
}

// rebase moves every start back by the virtual time, which becomes zero, and returns it.
func (ts *turns) rebase() time.Duration {
	base := ts.vtime
	for _, t := range ts.of {
		t.start -= base
	}
	ts.vtime = 0
	return base
}

// leave uncounts a waiter of k; a k with nobody waiting leaves the turns.
func (ts *turns) leave(k string) {
	t := ts.of[k]
	if t == nil {
		return
	}
	if t.waiting--; t.waiting <= 0 {
		delete(ts.of, k)
	}
}

// settle moves k's next turn by delta when k waits (a correction of what its last grant
// charged); a refund brings it back no earlier than the virtual time, and never later than it
// was.
func (ts *turns) settle(k string, delta time.Duration) {
	if t := ts.of[k]; t != nil {
		t.start = max(t.start+delta, min(t.start, ts.vtime))
	}
}

func (ts *turns) startOf(k string) time.Duration {
	if t := ts.of[k]; t != nil {
		return t.start
	}
	return ts.vtime
}

// knowLocked notes key as served now. Past knownKeys keys it forgets those served once, but for
// the latest quarter: fresh identities served once each (a minted credential per call, instant
// answers to churn them fast) push out one another, not a tenant that came back. Only when that
// forgets too few (most keys came back) does it forget the half served longest ago, whatever
// their count: so each forgetting frees a quarter of the keys at least, and costs a pass over
// them no more often than every quarter of knownKeys seats.
func (p *Pool) knowLocked(key string) *knownKey {
	p.served++
	kk := p.known[key]
	if kk == nil {
		kk = &knownKey{}
		p.known[key] = kk
	}
	kk.served, kk.grants = p.served, min(kk.grants+1, 2)
	if len(p.known) <= knownKeys {
		return kk
	}
	before, recent := len(p.known), p.served-knownKeys/4
	for k, at := range p.known {
		if at.grants < 2 && at.served <= recent {
			delete(p.known, k)
		}
	}
	if before-len(p.known) < knownKeys/4 {
		cut := p.served - knownKeys/2
		for k, at := range p.known {
			if at.served <= cut {
				delete(p.known, k)
			}
		}
	}
	return kk
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

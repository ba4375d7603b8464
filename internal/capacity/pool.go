// Package capacity holds the gateway's capacity (docs/capacity.md): one upstream's seats in
// this process and the order its waiters are served in, the seats shared among replicas through
// a store.SharedSeats, a seat held with its shared part, the adaptive limit of `limit auto`, the
// model server's metrics that steer it, and the urgency of a request's Priority header. It knows
// nothing of Caddy or the HTTP handler: time is the clock it is given, and the module wires it
// to the config, the storage, the runners and the metrics.
package capacity

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/store"
)

// ErrNoSeat: no seat came free within the call's wait.
var ErrNoSeat = errors.New("no upstream seat came free in time")

// Ask is who asks for a seat: the order they wait in (docs/capacity.md, "The order").
type Ask struct {
	Urgency int       // RFC 9218's, from the Priority header or the gateway
	Lift    int       // levels more urgent than Urgency it asks for its own key's work (an operation's)
	Trusted bool      // Urgency counts across fairness keys: an operator's class or the gateway's own
	Scope   string    // the caller's scope
	Key     string    // the fairness key; "" is the scope
	Weight  float64   // the key's share against weight-1 keys; below 1 is 1
	Since   time.Time // when the work began to wait (an operation: when it was submitted)
}

// Waiter is one ask waiting in the pool.
type Waiter struct {
	Ask     Ask
	ready   chan struct{} // closed when granted
	granted bool
	taken   bool          // the seat went to the caller (or was given back unused)
	lane    string        // the fairness lane it waits in (fair.go)
	charged time.Duration // the slot time its grant charged its turn (fair.go)
	// laneW and keyW are the weights its grant divided the charge by: its lane's, and among
	// the newcomers its key's; a correction divides by the same.
	laneW, keyW float64
	settled     bool          // the charge was corrected to the slot time its seat held
	grantedAt   time.Time     // when its seat was granted
	toppedUp    time.Duration // charged since, as its call outran its charge (fair.go)
}

// Config is how many seats a pool has: Limit, or with Auto a limit that adapts between Min and
// Max (docs/capacity.md; under `shared N`, Upstream.Configure raises Min to N: sharedFloor).
type Config struct {
	Limit    int
	Auto     bool
	Min, Max int
}

// Pool is one upstream's seats in this process, and the one order its waiters are served in:
// the band (trusted urgency, raised one level per store.AgingStep waited), then the fairness
// keys' turns (fair.go), then the caller's own urgency within its key, then the oldest.
type Pool struct {
	clock clockwork.Clock

	mu      sync.Mutex
	limit   int
	inUse   int
	waiting []*Waiter
	keys    turns                // the lanes waiting: keys served lately, and the newcomers (fair.go)
	newKeys turns                // the newcomers' keys waiting, within their lane
	known   map[string]*knownKey // keys served lately (fair.go)
	running map[*Waiter]struct{} // granted and not yet settled: their calls' time is charged as it goes
	served  uint64
	hold    time.Duration // the slot time calls held lately, weighted by it (fair.go)
	slot    slotAverage   // what hold is made of
	// newcomersHold is the slot time the newcomers' calls held lately (fair.go): never less
	// is charged to a grant in their lane.
	newcomersHold time.Duration
	// newcomersFinish is where the newcomers' lane's last turn ended.
	newcomersFinish time.Duration
	adapt           *Adaptive
	drain           DrainRate

	server      ServerState // the model server's state as last read (Follow)
	serverUntil time.Time   // until then it steers an adaptive limit, not latency
	stats       counters
}

// counters are a pool's totals since the process started.
type counters struct {
	refused       int64 // sync calls that found no seat within their wait
	queueTimeouts int64 // operations failed QUEUE_TIMEOUT
}

// NewPool returns a pool of cfg's seats on clock.
func NewPool(clock clockwork.Clock, cfg Config) *Pool {
	p := &Pool{clock: clock, keys: newTurns(false), newKeys: newTurns(true), known: map[string]*knownKey{}, running: map[*Waiter]struct{}{},
		hold: defaultHold, slot: slotAverage{sum: defaultHold.Seconds(), squares: defaultHold.Seconds() * defaultHold.Seconds()}}
	p.Configure(cfg)
	return p
}

// Configure applies a (re)loaded block's settings; seats in use stay in use.
func (p *Pool) Configure(cfg Config) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !cfg.Auto:
		p.adapt, p.limit = nil, cfg.Limit
	case p.adapt == nil:
		p.adapt = NewAdaptive(cfg.Min, cfg.Max)
		p.limit = p.adapt.Current()
	default:
		p.adapt.Bound(cfg.Min, cfg.Max)
		p.limit = p.adapt.Current()
	}
	p.grantLocked()
}

// Enqueue puts ask in the order, granting it a seat at once when one is free and nobody waits.
func (p *Pool) Enqueue(ask Ask) *Waiter {
	w := &Waiter{Ask: ask, ready: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.joinLocked(w)
	if len(p.waiting) == 0 && p.inUse < p.limit {
		p.grantToLocked(w)
		return w
	}
	p.waiting = append(p.waiting, w)
	return w
}

// TryTake takes a seat when one is free and nobody waits, without a place in the order (the
// durable queue's head, whose order the storage keeps); false otherwise. The seat is given
// back with Release or GiveBack like any other.
func (p *Pool) TryTake() (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waiting) > 0 || p.inUse >= p.limit {
		return time.Time{}, false
	}
	p.inUse++
	return p.clock.Now(), true
}

// Await waits for w's seat up to wait (zero: until ctx ends) and returns when the seat's call
// starts; on failure w leaves the order.
func (p *Pool) Await(ctx context.Context, w *Waiter, wait time.Duration) (time.Time, error) {
	var expired <-chan time.Time
	if wait > 0 {
		t := p.clock.NewTimer(wait)
		defer t.Stop()
		expired = t.Chan()
	}
	var err error
	select {
	case <-w.ready:
	case <-expired:
		err = ErrNoSeat
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !w.granted {
		p.dropLocked(w)
		return time.Time{}, err
	}
	w.taken = true // granted, perhaps in the same instant the wait ended: the seat is the caller's
	return p.clock.Now(), nil
}

// Abandon takes w out of the order for good: a seat granted to it and never taken is freed.
func (p *Pool) Abandon(w *Waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !w.granted:
		p.dropLocked(w)
	case !w.taken:
		w.taken = true
		p.inUse--
		p.settleLocked(w, 0, false)
		p.grantLocked()
	}
}

// dropLocked takes w, which gave up, out of the order.
func (p *Pool) dropLocked(w *Waiter) {
	if p.removeLocked(w) {
		p.leaveLocked(w, false)
	}
}

// removeLocked takes w out of the waiting list; false when it was not there.
func (p *Pool) removeLocked(w *Waiter) bool {
	for i, x := range p.waiting {
		if x == w {
			p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// Release gives back a seat whose call started at start, telling the adaptive limit how the
// call went (docs/capacity.md); the pool fills in the sample's latency and calls in flight. w is
// the waiter the seat was granted to, whose key's turn is charged the time the seat was held;
// nil for a seat taken without waiting (TryTake).
func (p *Pool) Release(w *Waiter, start time.Time, s Sample) {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse--
	p.settleLocked(w, now.Sub(start), true)
	p.drain.Record(now)
	if p.adapt != nil && !p.followsServerLocked(now) {
		s.Latency, s.InFlight = now.Sub(start), p.inUse+1
		p.limit = p.adapt.Update(s)
	}
	p.grantLocked()
}

// Detach settles granted waiter w's turn as for a seat never used: the seat it got goes to other
// work, whose time is charged to no key.
func (p *Pool) Detach(w *Waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settleLocked(w, 0, false)
}

// GiveBack returns a seat that was never used for a call: it tells the limit nothing, and w's
// key (nil: none, as for Release) is charged the least a turn costs.
func (p *Pool) GiveBack(w *Waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse--
	p.settleLocked(w, 0, false)
	p.grantLocked()
}

// grantLocked gives free seats to the next waiters in order.
func (p *Pool) grantLocked() {
	if p.inUse < p.limit && len(p.waiting) > 0 {
		p.topUpLocked(p.clock.Now())
	}
	for p.inUse < p.limit && len(p.waiting) > 0 {
		w := p.waiting[p.nextLocked(p.clock.Now())]
		p.removeLocked(w)
		p.grantToLocked(w)
	}
}

// grantToLocked gives w a seat: its key's turn moves on.
func (p *Pool) grantToLocked(w *Waiter) {
	p.inUse++
	p.leaveLocked(w, true)
	w.granted, w.grantedAt = true, p.clock.Now()
	p.running[w] = struct{}{}
	close(w.ready)
}

// nextLocked picks the waiter served next (before, fair.go).
func (p *Pool) nextLocked(now time.Time) int {
	best := 0
	for i := 1; i < len(p.waiting); i++ {
		if p.before(p.waiting[i], p.waiting[best], now) {
			best = i
		}
	}
	return best
}

// effectiveUrgency is the ask's urgency raised by waiting, as the durable queue raises it
// (store.AgingStep per level), so a steady stream of more urgent work cannot starve it.
func effectiveUrgency(a Ask, now time.Time) int {
	return store.OwnUrgency(a.Urgency, a.Lift, now.Sub(a.Since))
}

// RetryAfter estimates when a refused call may find a seat: the work waiting ahead of it over
// the measured drain rate, between 1s and 5 minutes.
func (p *Pool) RetryAfter() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drain.TimeFor(len(p.waiting)+1, p.clock.Now())
}

// Snapshot is a pool's state for metrics and /mulligan/stats.
type Snapshot struct {
	Limit          int     `json:"limit"`
	Auto           bool    `json:"auto"`
	InUse          int     `json:"in_use"`
	Waiting        [8]int  `json:"waiting_by_urgency"`
	DrainPerSecond float64 `json:"drain_per_second"`
	Refused        int64   `json:"refused"`
	QueueTimeouts  int64   `json:"queue_timeouts"`
	// Server is the model server's state while its metrics steer the limit; nil otherwise
	// (none configured, or stale: the latency signal steers).
	Server *ServerState `json:"server,omitempty"`
}

// Snapshot reads the pool's state.
func (p *Pool) Snapshot() Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Snapshot{Limit: p.limit, Auto: p.adapt != nil, InUse: p.inUse, DrainPerSecond: p.drain.PerSecond(p.clock.Now()),
		Refused: p.stats.refused, QueueTimeouts: p.stats.queueTimeouts}
	if p.followsServerLocked(p.clock.Now()) {
		st := p.server
		s.Server = &st
	}
	now := p.clock.Now()
	for _, w := range p.waiting {
		s.Waiting[w.Ask.Band(now)]++ // the urgency it waits at: a forged u=0 shows as the default
	}
	return s
}

// Waiting lists the asks waiting, in no particular order.
func (p *Pool) Waiting() []Ask {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Ask, len(p.waiting))
	for i, w := range p.waiting {
		out[i] = w.Ask
	}
	return out
}

// Remembered is how many fairness keys the pool keeps a turn for (only the keys waiting; the
// keys served lately, bounded, are remembered apart).
func (p *Pool) Remembered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.keys.of) + len(p.newKeys.of)
}

// CountRefusal counts a sync call answered 503 UPSTREAM_SATURATED (a call queued instead is
// not refused).
func (p *Pool) CountRefusal() {
	p.mu.Lock()
	p.stats.refused++
	p.mu.Unlock()
}

// CountQueueTimeout counts an operation failed QUEUE_TIMEOUT.
func (p *Pool) CountQueueTimeout() {
	p.mu.Lock()
	p.stats.queueTimeouts++
	p.mu.Unlock()
}

// DrainRate measures how fast seats come free: the last drainSamples releases.
type DrainRate struct {
	times [drainSamples]time.Time
	n     int
}

const drainSamples = 64

// Record notes a release at at.
func (d *DrainRate) Record(at time.Time) {
	d.times[d.n%drainSamples] = at
	d.n++
}

// drainWindow is how far back a release still tells the drain rate: older samples describe a
// load that is gone.
const drainWindow = time.Minute

// PerSecond is the releases per second over the samples of the last drainWindow (0 with fewer
// than two: the rate is not known).
func (d *DrainRate) PerSecond(now time.Time) float64 {
	k := 0
	var newest, oldest time.Time
	for i := d.n - 1; i >= 0 && i >= d.n-drainSamples; i-- {
		t := d.times[i%drainSamples]
		if now.Sub(t) > drainWindow {
			break
		}
		if k == 0 {
			newest = t
		}
		oldest, k = t, k+1
	}
	span := newest.Sub(oldest)
	if k < 2 || span <= 0 {
		return 0
	}
	return float64(k-1) / span.Seconds()
}

// TimeFor is how long n more releases take at the measured rate, between 1s and 5 minutes;
// clamped in float, since n over a tiny rate overflows a Duration.
func (d *DrainRate) TimeFor(n int, now time.Time) time.Duration {
	rate := d.PerSecond(now)
	if rate <= 0 {
		return time.Second
	}
	secs := min(max(float64(n)/rate, 1), 300)
	return time.Duration(secs * float64(time.Second))
}

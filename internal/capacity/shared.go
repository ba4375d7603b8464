package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
)

// Shared is a pool's share of the seats every replica on one PostgreSQL storage holds together
// (capacity `shared N`, docs/capacity.md). A call takes a local seat first, then one of the N
// shared ones. One poller per pool looks for a free shared seat for all of this replica's
// waiters, in the order they came, so the database sees one transaction per look however many
// calls wait; each look stands this replica's best waiter in the fleet's line, so a seat that
// comes free goes to the fleet's most urgent waiter, not to the replica that looks first. The
// replica renews exactly the seats its calls hold: a seat whose release failed, or whose taking
// committed but whose answer was lost, is held by no call, is not renewed, and lapses after its
// lease. A call whose seat can no longer be renewed before it lapses is cut
// (Watch), since another replica may take its place.
type Shared struct {
	on     atomic.Pointer[seatStore] // where the seats are taken: Rebind moves them
	clock  clockwork.Clock
	name   string
	worker string
	limit  atomic.Int64
	lease  time.Duration
	margin time.Duration
	every  time.Duration
	newID  func(now time.Time) string
	log    *zap.Logger
	kick   chan struct{} // a seat of this replica came free, or a call came that goes first: look at once
	slow   time.Duration // SharedOptions.SlowLook

	mu       sync.Mutex
	waiting  []*sharedWaiter // in the order they came
	looks    uint64          // looks begun
	polling  bool            // the poller runs while anyone waits
	inLine   bool            // a look or a handover may have stood a call of this replica in the fleet's line
	stood    uint64          // handovers that may have stood a call in line, answered so far
	handing  int             // handovers under way, each for one of the waiters
	held     map[string]*Held
	renewing bool // the renewer runs while any seat is held
	// granted is when each key last got a seat here, for the keys' turns (at most
	// maxGrantedKeys, the oldest forgotten first); with the fleet's turns, their turns as the
	// latest read gave them (readFleetTurns).
	granted map[string]time.Time
	// bands is each band's virtual time as the latest read of the fleet's turns gave it (zero:
	// not read): a call stands no sooner than its band's.
	bands [8]time.Time
}

// seatStore is the storage handle a Shared takes its seats from, with what it does besides.
type seatStore struct {
	st    store.SharedSeats
	freed <-chan struct{}    // the storage says a seat may have come free on any replica; nil: it cannot
	turns store.SeatTurns    // the fleet's turns, read before each look; nil: this replica's only
	hand  store.SeatHandover // gives a seat back and takes one in one step; nil: it cannot
	line  store.SeatLine     // counts the fleet's waiters; nil: it cannot
}

func newSeatStore(st store.SharedSeats, pool string) *seatStore {
	on := &seatStore{st: st}
	if n, ok := st.(store.SeatNotices); ok {
		on.freed = n.SeatsFreed(pool)
	}
	on.turns, _ = st.(store.SeatTurns)
	on.hand, _ = st.(store.SeatHandover)
	on.line, _ = st.(store.SeatLine)
	return on
}

// maxGrantedKeys bounds the keys whose last seat Shared remembers, as the pool bounds the keys
// it knows.
const maxGrantedKeys = 4096

// SharedOptions are what shared seats need to know of their storage and replica.
type SharedOptions struct {
	Name   string // the pool's name in storage: the same on every replica
	Worker string // this replica's name as the storage knows it
	Limit  int    // N of `shared N`
	// Lease is how long a seat stays held without a renewal: the storage's takeover.
	Lease time.Duration
	// Margin is how long before its lease ends a seat that could not be renewed cuts its call,
	// and Renew how often held seats are renewed: an operation's lease uses the same two
	// (internal/runner), so a seat and the operation holding it are lost alike.
	Margin, Renew time.Duration
	Clock         clockwork.Clock
	Log           *zap.Logger
	NewID         func(now time.Time) string // names a seat taken at now
	// SlowLook is how long past its wait a call waits for a look at the seats to answer, in
	// real time (0: slowLook).
	SlowLook time.Duration
}

// sharedWaiter is a call waiting for a shared seat.
type sharedWaiter struct {
	key      string    // its fairness key (keyOf): keys take turns within a band
	weight   float64   // the key's (weightOf): its share of the fleet's seats
	urgency  int       // its band (Ask.Band): the most urgent is served first
	came     time.Time // then the one waiting longest, here and across the fleet
	deadline time.Time // zero: until its context ends
	after    uint64    // the looks begun before it came: a failed later one covers it
	got      chan sharedGrant
}

// sharedGrant is what a waiter gets: a seat, or why not.
type sharedGrant struct {
	seat *Held
	err  error
}

// Held is a shared seat a call holds; its fields are guarded by its Shared's mu.
type Held struct {
	id     string
	until  time.Time               // its lease as last taken or renewed
	expiry clockwork.Timer         // cuts the call margin before until
	cut    context.CancelCauseFunc // the call's, once it watches; nil before
	lapsed bool                    // could not be renewed in time: the call is cut
}

// ErrSeatLapsed cuts a call whose shared seat could not be renewed before its lease ended.
var ErrSeatLapsed = errors.New("the call's shared seat could not be renewed before its lease ended")

// sharedPoll paces the look for a shared seat held by another replica.
const sharedPoll = 20 * time.Millisecond

// NewShared returns the shared seats of one pool, taken from st.
func NewShared(st store.SharedSeats, o SharedOptions) *Shared {
	s := &Shared{clock: o.Clock, name: o.Name, worker: o.Worker, lease: o.Lease, margin: o.Margin,
		every: o.Renew, newID: o.NewID, log: o.Log, kick: make(chan struct{}, 1), held: map[string]*Held{}}
	s.on.Store(newSeatStore(st, o.Name))
	s.limit.Store(int64(o.Limit))
	if s.slow = o.SlowLook; s.slow <= 0 {
		s.slow = slowLook
	}
	return s
}

// Rebind takes the seats from st from now on: another handle on the same database, as a reload
// that opens the storage anew gives while the old handle closes. The seats held, the place in
// the fleet's line and the turns are the database's, so they carry over under the same worker:
// the seats are renewed, and the calls waiting look, through st.
func (s *Shared) Rebind(st store.SharedSeats) {
	s.on.Store(newSeatStore(st, s.name))
	select { // a pause waiting on the old handle's notices looks again through the new one
	case s.kick <- struct{}{}:
	default:
	}
}

// SetLimit applies a reloaded `shared N`.
func (s *Shared) SetLimit(n int) { s.limit.Store(int64(n)) }

// Take waits for a shared seat for a call of fairness key key, of weight weight (below 1 is 1),
// until ctx ends or deadline (zero: none); it returns the seat. A waiter whose deadline passes gets ErrNoSeat once a look begun
// after it came found none. Seats found go to the most urgent waiter, then the one whose turn
// comes first (turnLocked), then the one that came first.
func (s *Shared) Take(ctx context.Context, deadline time.Time, urgency int, key string, weight float64) (*Held, error) {
	w := &sharedWaiter{key: key, weight: weight, urgency: urgency, came: s.clock.Now(), deadline: deadline, got: make(chan sharedGrant, 1)}
	s.mu.Lock()
	w.after = s.looks
	s.waiting = append(s.waiting, w)
	start := !s.polling
	// A call that goes before every other waiting here is looked for at once rather than at
	// the next poll: the place this replica stands in the fleet's line is its best call's.
	best := !start && s.waiting[s.mostUrgentLocked()] == w
	s.polling = true
	s.mu.Unlock()
	if start {
		go s.poll()
	} else if best {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	var late <-chan time.Time
	if !deadline.IsZero() {
		// A look that takes longer than the storage should (a database that hangs rather than
		// fails, each look up to its query timeout) does not hold a call past its wait: the
		// shared seats fail closed, as when the storage fails. Real time: it is the storage's
		// slowness, whatever the gateway's clock.
		t := time.NewTimer(max(s.clock.Until(deadline), 0) + s.slow)
		defer t.Stop()
		late = t.C
	}
	err := error(nil)
	select {
	case g := <-w.got:
		return g.seat, g.err
	case <-ctx.Done():
		err = context.Cause(ctx)
	case <-late:
		err = errSlowLook
	}
	s.mu.Lock()
	left := s.dropWaiterLocked(w)
	s.mu.Unlock()
	if !left { // answered in the same instant: a seat is nobody's now
		if g := <-w.got; g.seat != nil {
			s.Give(g.seat)
		}
	}
	return nil, err
}

// slowLook is how long past its wait a call waits for a look at the shared seats to answer.
const slowLook = 2 * time.Second

// errSlowLook fails a call whose wait for a shared seat ended while the storage had not
// answered a look begun for it.
var errSlowLook = fmt.Errorf("%w: the storage did not answer a look for a shared seat in time after the call's wait", store.ErrUnavailable)

// dropWaiterLocked takes w out of the waiters; false when it was no longer there (answered).
func (s *Shared) dropWaiterLocked(w *sharedWaiter) bool {
	for i, x := range s.waiting {
		if x == w {
			s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// answerLocked gives the waiter at i its answer and takes it out of the waiters.
func (s *Shared) answerLocked(i int, g sharedGrant) {
	w := s.waiting[i]
	s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
	if g.seat != nil && s.on.Load().turns == nil { // the fleet's turns are read before each look
		if lane := s.laneLocked(w); lane != w.key {
			s.grantedLocked(lane) // the newcomers' turn moves on
		}
		s.grantedLocked(w.key)
	}
	w.got <- g
}

// newcomers is the lane of the keys that got no shared seat here lately: they take one turn
// between them, as the pool's newcomers do (fair.go), so that a fresh credential per call buys
// no more than one turn against a tenant served before.
const sharedNewcomers = "\x00newcomers"

// laneLocked is the lane w takes turns in: its key once it got a seat here, else the newcomers'.
func (s *Shared) laneLocked(w *sharedWaiter) string {
	if _, ok := s.granted[w.key]; ok {
		return w.key
	}
	return sharedNewcomers
}

// grantedLocked notes that key got a seat now, forgetting the key granted longest ago past
// maxGrantedKeys.
func (s *Shared) grantedLocked(key string) {
	if s.granted == nil {
		s.granted = map[string]time.Time{}
	}
	if _, ok := s.granted[key]; !ok && len(s.granted) >= maxGrantedKeys {
		oldest, at := "", time.Time{}
		for k, t := range s.granted {
			if oldest == "" || t.Before(at) {
				oldest, at = k, t
			}
		}
		delete(s.granted, oldest)
	}
	s.granted[key] = s.clock.Now()
}

// maxTurnKeys bounds the keys whose fleet turns one look reads: past them, a replica's waiting
// keys keep the turns it knows.
const maxTurnKeys = 256

// readFleetTurns reads the fleet's turns of the keys waiting here (store.SeatTurns), in slot
// time, as the turns this replica orders its waiters by (turnLocked), so that a key served on
// another replica waits its turn here, and the newcomers' turn is the fleet's. They only choose
// between keys, so with one key waiting (the most common case, a look after each seat) nothing
// is read: the storage ranks the place in line by the fleet's turns itself. A failure leaves the
// turns of the latest read: the look that follows says whether the storage answers.
func (s *Shared) readFleetTurns() {
	turns := s.on.Load().turns
	if turns == nil {
		return
	}
	s.mu.Lock()
	keys := []string{store.SeatNewcomers}
	seen := map[string]bool{}
	var band [8]bool
	for _, w := range s.waiting {
		if u := min(max(w.urgency, 0), 7); !band[u] {
			band[u] = true
			keys = append(keys, store.SeatBandTime(u))
		}
	}
	for _, w := range s.waiting {
		if !seen[w.key] && w.key != "" && len(keys) < maxTurnKeys {
			seen[w.key] = true
			keys = append(keys, w.key)
		}
	}
	s.mu.Unlock()
	if len(seen) < 2 {
		return
	}
	now := s.clock.Now()
	ago, err := turns.SeatTurnsAgo(s.name, keys)
	if err != nil {
		s.log.Debug("reading the fleet's turns for shared seats", zap.Error(err))
		return
	}
	// The turns read replace those of the latest read: a key without one (new, or forgotten) is
	// a newcomer again, and a turn may have moved back (a seat that held less than its charge).
	fleet := make(map[string]time.Time, len(ago))
	var bands [8]time.Time
	for u := range bands {
		if d, ok := ago[store.SeatBandTime(u)]; ok {
			bands[u] = now.Add(-d)
		}
	}
	for k, d := range ago {
		if k == store.SeatNewcomers {
			k = sharedNewcomers
		} else if !seen[k] { // a key the storage mended (store.LaneText) is not this replica's
			continue
		}
		fleet[k] = now.Add(-d)
	}
	s.mu.Lock()
	s.granted, s.bands = fleet, bands
	s.mu.Unlock()
}

// turnLocked is when w's turn comes. With the fleet's turns (store.SeatTurns), its lane's
// (laneLocked) as the latest read gave them, in slot time, or its band's virtual time if that
// is later: start-time fair queuing as the fleet's line keeps it, where the calls of one lane,
// and lanes at the same turn, go in the order they came here. The turns are read before each
// look when calls of two keys or more wait; a look follows each seat granted, so a handover
// picks its call by turns that count the latest grants. Else when it came, or when its lane last got a
// seat here if that is later: a key whose calls keep getting seats has its turn move on with
// each; a key that waits keeps the time its call came, so it goes before the busy key's next
// call, whoever came first.
func (s *Shared) turnLocked(w *sharedWaiter) time.Time {
	t, ok := s.granted[s.laneLocked(w)]
	if s.on.Load().turns != nil {
		if b := s.bands[min(max(w.urgency, 0), 7)]; b.After(t) {
			return b
		}
		return t
	}
	if ok && t.After(w.came) {
		return t
	}
	return w.came
}

// mostUrgentLocked is the index of the waiter a found seat goes to: the most urgent, then the
// one whose turn came first, then the first that came.
func (s *Shared) mostUrgentLocked() int {
	best := 0
	for i, w := range s.waiting {
		b := s.waiting[best]
		if w.urgency != b.urgency {
			if w.urgency < b.urgency {
				best = i
			}
			continue
		}
		if tw, tb := s.turnLocked(w), s.turnLocked(b); tw.Before(tb) {
			best = i
		}
	}
	return best
}

// SharedSnapshot is what /mulligan/stats and the metrics show of a pool's shared seats.
type SharedSnapshot struct {
	Limit   int    `json:"limit"`
	Held    int    `json:"held_by_replica"`
	Fleet   *int   `json:"held_by_fleet,omitempty"` // nil when the storage did not answer
	Waiting [8]int `json:"waiting_by_urgency"`
	// FleetWaiting counts every replica's calls waiting, as their places in the fleet's line
	// last said; nil when the storage did not answer or cannot count them.
	FleetWaiting *[8]int `json:"fleet_waiting_by_urgency,omitempty"`
}

// Snapshot reads the shared seats: this replica's, and the fleet's from the storage.
func (s *Shared) Snapshot() SharedSnapshot {
	s.mu.Lock()
	out := SharedSnapshot{Limit: int(s.limit.Load()), Held: len(s.held), Waiting: s.waitingLocked()}
	s.mu.Unlock()
	on := s.on.Load()
	if n, err := on.st.SeatsHeld(s.name); err == nil {
		out.Fleet = &n
	}
	if on.line != nil {
		if n, err := on.line.SeatWaitersByUrgency(s.name); err == nil {
			out.FleetWaiting = &n
		}
	}
	return out
}

// poll looks for a free shared seat while anyone waits, one look at a time: a seat found goes
// to the most urgent waiter; a look that finds none fails the waiters it covered whose deadline
// passed; a storage failure fails every waiter it covered (shared seats fail closed). Each look
// stands the most urgent waiter in the fleet's line, so a seat that comes free goes to the
// fleet's best call, not to the replica that looks first; once nobody waits, it leaves the line.
func (s *Shared) poll() {
	for {
		s.mu.Lock()
		if len(s.waiting) == 0 {
			s.polling = false
			inLine := s.inLine
			s.inLine = false
			s.mu.Unlock()
			if inLine {
				s.leaveLine()
			}
			return
		}
		if s.unservedLocked() <= 0 {
			// Each waiter has a seat handed over to it under way: a look now would take a
			// seat for nobody, and release it after. A handover that serves kicks the poller
			// when calls still wait; one that does not leaves its call to the next poll.
			s.mu.Unlock()
			s.pause(sharedPoll)
			continue
		}
		s.mu.Unlock()
		s.readFleetTurns()
		s.mu.Lock()
		if s.unservedLocked() <= 0 {
			s.mu.Unlock()
			continue
		}
		s.looks++
		look, stood := s.looks, s.stood
		best, ask := s.askLocked()
		s.mu.Unlock()
		// The storage leases the seat on its own clock from when it takes it; this replica
		// reckons the lease from before it asked, so it lets the seat go first (store.SharedSeats).
		now := s.clock.Now()
		id, until := s.newID(now), now.Add(s.lease)
		// A seat taken whose answer was lost (err) is held by no call: it lapses unrenewed.
		ok, err := s.on.Load().st.AcquireSeat(s.name, id, s.worker, int(s.limit.Load()), s.lease, ask)
		taken := ok && err == nil // an answer "taken" with an error may have been rolled back
		s.mu.Lock()
		switch {
		case taken:
			s.grantLocked(best, id, until)
			// A look that takes a seat takes this replica's place out of the line with it. A
			// handover answered meanwhile may have stood a place after it, so the replica counts
			// as in line still; one answered later says so itself.
			if s.stood == stood {
				s.inLine = false
			}
		default:
			s.inLine = true
			s.failCoveredLocked(look, err)
		}
		wait := s.nextLookLocked(taken)
		s.mu.Unlock()
		if wait > 0 {
			s.pause(wait)
		}
	}
}

// unservedLocked counts the waiters no handover under way is for (less than none when waiters
// left while seats were being handed over to them).
func (s *Shared) unservedLocked() int { return len(s.waiting) - s.handing }

// pause waits wait, or less when the poller is kicked or a seat is freed.
func (s *Shared) pause(wait time.Duration) {
	t := s.clock.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.Chan():
	case <-s.kick:
	case <-s.on.Load().freed:
	}
}

// waiters counts the calls waiting for a shared seat of s, not those only looking once (a
// deadline of when they came: Seats.WithShared).
func (s *Shared) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.waiting {
		if w.deadline.IsZero() || w.deadline.After(w.came) {
			n++
		}
	}
	return n
}

// askLocked is the call a look stands in the fleet's line for this replica, its most urgent
// waiter, and how the line ranks it. With the fleet's turns (store.SeatTurns) the storage ranks
// it by its key's turn in slot time, as the turns are when it compares the calls in line, then
// by when it came (Waited). Else it stands as waiting since its turn came (turnLocked): a key
// whose calls keep getting seats stands as if it had just come, behind another key's call that
// waits.
func (s *Shared) askLocked() (*sharedWaiter, store.SeatWaiter) {
	best := s.waiting[s.mostUrgentLocked()]
	from := s.turnLocked(best)
	if s.on.Load().turns != nil {
		from = best.came
	}
	return best, store.SeatWaiter{Urgency: best.urgency, Waited: s.clock.Since(from), Key: best.key, Weight: best.weight,
		Waiting: s.waitingLocked()}
}

// waitingLocked counts the calls waiting here by urgency.
func (s *Shared) waitingLocked() [8]int {
	var n [8]int
	for _, w := range s.waiting {
		n[min(max(w.urgency, 0), 7)]++
	}
	return n
}

// grantLocked gives seat id, held until `until`, to best, the call whose turn taking it moved
// on, or to the most urgent waiter should best have left meanwhile; with nobody waiting any more
// it is released.
func (s *Shared) grantLocked(best *sharedWaiter, id string, until time.Time) {
	if len(s.waiting) == 0 {
		go s.release(id, until)
		return
	}
	i := slices.Index(s.waiting, best)
	if i < 0 {
		i = s.mostUrgentLocked()
	}
	s.answerLocked(i, sharedGrant{seat: s.holdLocked(id, until)})
}

// leaveLine takes this replica out of the fleet's line for its pool: none of its calls waits. A
// failure is only logged: its place lapses after a second unrefreshed. Should a new poller have
// stood in line meanwhile, its next look (within sharedPoll) stands it there again.
func (s *Shared) leaveLine() {
	if err := s.on.Load().st.WithdrawWaiter(s.name, s.worker); err != nil {
		s.log.Warn("leaving the fleet's line for a shared seat", zap.Error(err))
	}
}

// failCoveredLocked answers the waiters that look, which found no seat, covered: all of them
// with err when the storage failed, else those whose deadline passed with ErrNoSeat.
func (s *Shared) failCoveredLocked(look uint64, err error) {
	now := s.clock.Now()
	for i := 0; i < len(s.waiting); i++ {
		if w := s.waiting[i]; w.after < look && (err != nil || !w.deadline.IsZero() && !now.Before(w.deadline)) {
			s.answerLocked(i, sharedGrant{err: errOr(err, ErrNoSeat)})
			i--
		}
	}
}

// errOr is err, or alt when err is nil.
func errOr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}

// nextLookLocked is how long the poller waits before its next look: none after a seat was
// found (another may be free) or when nobody waits (it then ends), else sharedPoll, or less
// when a waiter's deadline comes first.
func (s *Shared) nextLookLocked(found bool) time.Duration {
	if found || len(s.waiting) == 0 {
		return 0
	}
	wait := sharedPoll
	for _, w := range s.waiting {
		if !w.deadline.IsZero() {
			wait = min(wait, max(s.clock.Until(w.deadline), 0))
		}
	}
	return wait
}

// holdLocked notes seat id as held by a call until `until`, renewed from now on.
func (s *Shared) holdLocked(id string, until time.Time) *Held {
	h := &Held{id: id, until: until}
	s.held[id] = h
	s.armLocked(h)
	if !s.renewing {
		s.renewing = true
		go s.renew()
	}
	return h
}

// armLocked (re)sets h's timer to cut its call margin before its lease ends, whether or not a
// renewal ever answers (as an operation's lease does, internal/runner).
func (s *Shared) armLocked(h *Held) {
	wait := s.clock.Until(h.until.Add(-s.margin))
	if h.expiry != nil {
		h.expiry.Reset(wait)
		return
	}
	h.expiry = s.clock.AfterFunc(wait, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		// A renewal may have moved until on since the timer fired; the timer never fires early,
		// so on a clock that stands at the instant (a fake one) the cut is due.
		if s.held[h.id] == h && !s.clock.Now().Before(h.until.Add(-s.margin)) {
			s.log.Warn("cutting a call whose shared seat could not be renewed", zap.String("seat", h.id))
			s.lapseLocked(h)
		}
	})
}

// lapseLocked stops renewing h and cuts its call: its seat lapses, or is taken by another
// replica, while the call ends.
func (s *Shared) lapseLocked(h *Held) {
	delete(s.held, h.id)
	h.expiry.Stop()
	h.lapsed = true
	if h.cut != nil {
		h.cut(ErrSeatLapsed)
	}
}

// Watch returns ctx, canceled with ErrSeatLapsed when h can no longer be renewed before it
// lapses; stop ends the watch.
func (s *Shared) Watch(ctx context.Context, h *Held) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	s.mu.Lock()
	if h.lapsed {
		cancel(ErrSeatLapsed)
	} else {
		h.cut = cancel
	}
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		h.cut = nil
		s.mu.Unlock()
		cancel(nil)
	}
}

// Give returns a shared seat: it is no longer renewed, and released (see release), or handed
// over (handOver) when calls of this replica wait.
func (s *Shared) Give(h *Held) {
	s.mu.Lock()
	if s.held[h.id] == h {
		delete(s.held, h.id)
		h.expiry.Stop()
	}
	until := h.until
	var best *sharedWaiter
	var ask store.SeatWaiter
	hand := s.on.Load().hand
	if hand != nil && s.unservedLocked() > 0 { // seats given back at once each go to another waiter
		best, ask = s.askLocked()
		s.handing++
	}
	s.mu.Unlock()
	if best != nil && s.handOver(hand, h.id, best, ask) {
		return
	}
	s.release(h.id, until)
}

// handOver gives seat id back and, in the same step, stands this replica's best waiter, best
// as ask, in the fleet's line for it (store.SeatHandover), as a look would after the release,
// with the turns this replica read at its latest look: one commit instead of two, and no notice
// or wake-up between them, while the model server's slot is free. The seat goes to best when it
// is due, else to the fleet's better call, whose replica is told. False when the storage failed:
// the seat is then released as without a handover.
func (s *Shared) handOver(hand store.SeatHandover, id string, best *sharedWaiter, ask store.SeatWaiter) bool {
	now := s.clock.Now()
	next, until := s.newID(now), now.Add(s.lease) // reckoned from before asking, as in poll
	ok, err := hand.HandOverSeat(s.name, id, next, s.worker, int(s.limit.Load()), s.lease, ask)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handing--
	switch {
	case err == nil && ok:
		s.grantLocked(best, next, until)
		// Served, the call left the fleet's line, and this replica with it: its next call
		// waiting stands there at once, as after a look that found a seat, not at the next poll.
		// (Not served, the call stands in line as after a look, and the poller, which let it
		// be while the handover was under way, looks again at its next poll or notice.)
		if len(s.waiting) > 0 {
			select {
			case s.kick <- struct{}{}:
			default:
			}
		}
	case s.polling:
		s.inLine = true // the place it may have stood: the poller leaves the line once nobody waits
		s.stood++
	default: // nobody waits any more, and the poller has ended: the place stood is nobody's
		go s.leaveLine()
	}
	if err != nil {
		s.log.Debug("handing a shared seat over; releasing it", zap.Error(err))
		return false
	}
	return true
}

// Retrying a release that failed: until the seat's lease ends, after which it has lapsed.
const (
	releaseRetryBase = 50 * time.Millisecond
	releaseRetryMax  = time.Second
)

// release deletes seat id, held until `until` at most, and wakes the poller for the seat it
// frees. A failed release is retried in the background until the seat's lease ends; it is
// renewed by no one, so it lapses then whatever happens.
func (s *Shared) release(id string, until time.Time) {
	if s.releaseOnce(id) {
		return
	}
	go func() {
		for wait := releaseRetryBase; s.clock.Now().Add(wait).Before(until); wait = min(2*wait, releaseRetryMax) {
			s.clock.Sleep(wait)
			if s.releaseOnce(id) {
				return
			}
		}
	}()
}

func (s *Shared) releaseOnce(id string) bool {
	if err := s.on.Load().st.ReleaseSeat(s.name, id); err != nil {
		s.log.Warn("releasing a shared seat; retrying until its lease ends", zap.String("seat", id), zap.Error(err))
		return false
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return true
}

// renew extends the seats this replica's calls hold while any is held, every s.every: those it
// could not renew (they lapsed, another replica may have taken their place) have their calls
// cut at once; while renewals fail, each seat's timer cuts its call before it lapses.
func (s *Shared) renew() {
	for {
		s.clock.Sleep(s.every)
		s.mu.Lock()
		if len(s.held) == 0 {
			s.renewing = false
			s.mu.Unlock()
			return
		}
		ids := make([]string, 0, len(s.held))
		for id := range s.held {
			ids = append(ids, id)
		}
		s.mu.Unlock()
		until := s.clock.Now().Add(s.lease) // reckoned from before asking, as in poll
		renewed, err := s.on.Load().st.RenewSeats(s.name, s.worker, ids, s.lease)
		if err != nil {
			s.log.Warn("renewing shared seats", zap.Int("seats", len(ids)), zap.Error(err))
			continue
		}
		s.renewed(ids, renewed, until)
	}
}

// renewed applies a renewal of ids: the renewed ones hold until `until`, the others lapsed.
func (s *Shared) renewed(ids, renewed []string, until time.Time) {
	ok := make(map[string]bool, len(renewed))
	for _, id := range renewed {
		ok[id] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		h := s.held[id]
		switch {
		case h == nil: // given back meanwhile
		case ok[id]:
			h.until = until
			s.armLocked(h)
		default:
			s.log.Warn("a shared seat lapsed before its renewal; cutting its call", zap.String("seat", id))
			s.lapseLocked(h)
		}
	}
}

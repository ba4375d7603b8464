package module

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
)

// sharedSeats is a pool's share of the seats every replica on one PostgreSQL storage holds
// together (capacity `shared N`, docs/capacity.md). A call takes a local seat first, then one
// of the N shared ones. One poller per pool looks for a free shared seat for all of this
// replica's waiters, in the order they came, so the database sees one transaction per look
// however many calls wait. The replica renews exactly the seats its calls hold: a seat whose
// release failed, or whose taking committed but whose answer was lost, is held by no call, is
// not renewed, and lapses after its lease. A call whose seat can no longer be renewed before
// it lapses is cut (watch), since another replica may take its place.
type sharedSeats struct {
	st     store.SharedSeats
	name   string // the pool's name in storage: the same on every replica
	worker string
	limit  atomic.Int64 // N of `shared N`; a reload may change it
	lease  time.Duration
	log    *zap.Logger
	kick   chan struct{} // a seat of this replica came free: look at once

	mu       sync.Mutex
	waiting  []*sharedWaiter // in the order they came
	looks    uint64          // looks begun
	polling  bool            // the poller runs while anyone waits
	held     map[string]*heldSeat
	renewing bool // the renewer runs while any seat is held
}

// sharedWaiter is a call waiting for a shared seat.
type sharedWaiter struct {
	urgency  int       // its band (capacity.Ask.Band): the most urgent is served first
	deadline time.Time // zero: until its context ends
	after    uint64    // the looks begun before it came: a failed later one covers it
	got      chan sharedGrant
}

// sharedGrant is what a waiter gets: a seat, or why not.
type sharedGrant struct {
	seat *heldSeat
	err  error
}

// heldSeat is a shared seat a call holds; its fields are guarded by the pool's sharedSeats.mu.
type heldSeat struct {
	id     string
	until  time.Time               // its lease as last taken or renewed
	expiry *time.Timer             // cuts the call leaseMargin before until
	cut    context.CancelCauseFunc // the call's, once it watches; nil before
	lapsed bool                    // could not be renewed in time: the call is cut
}

// errSeatLapsed cuts a call whose shared seat could not be renewed before its lease ended.
var errSeatLapsed = errors.New("the call's shared seat could not be renewed before its lease ended")

// sharedPoll paces the look for a shared seat held by another replica.
const sharedPoll = 20 * time.Millisecond

func newSharedSeats(st store.SharedSeats, name, worker string, limit int, lease time.Duration, log *zap.Logger) *sharedSeats {
	s := &sharedSeats{st: st, name: name, worker: worker, lease: lease, log: log,
		kick: make(chan struct{}, 1), held: map[string]*heldSeat{}}
	s.limit.Store(int64(limit))
	return s
}

// take waits for a shared seat until ctx ends or deadline (zero: none); it returns the seat.
// A waiter whose deadline passes gets errNoSeat once a look begun after it came found none.
// Seats found go to the most urgent waiter, then the one that came first.
func (s *sharedSeats) take(ctx context.Context, deadline time.Time, urgency int) (*heldSeat, error) {
	w := &sharedWaiter{urgency: urgency, deadline: deadline, got: make(chan sharedGrant, 1)}
	s.mu.Lock()
	w.after = s.looks
	s.waiting = append(s.waiting, w)
	start := !s.polling
	s.polling = true
	s.mu.Unlock()
	if start {
		go s.poll()
	}
	select {
	case g := <-w.got:
		return g.seat, g.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	left := s.dropWaiterLocked(w)
	s.mu.Unlock()
	if !left { // granted in the same instant: nobody will use it
		if g := <-w.got; g.seat != nil {
			s.give(g.seat)
		}
	}
	return nil, context.Cause(ctx)
}

// dropWaiterLocked takes w out of the waiters; false when it was no longer there (answered).
func (s *sharedSeats) dropWaiterLocked(w *sharedWaiter) bool {
	for i, x := range s.waiting {
		if x == w {
			s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// answerLocked gives the waiter at i its answer and takes it out of the waiters.
func (s *sharedSeats) answerLocked(i int, g sharedGrant) {
	w := s.waiting[i]
	s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
	w.got <- g
}

// mostUrgentLocked is the index of the waiter a found seat goes to: the most urgent, then the
// first that came.
func (s *sharedSeats) mostUrgentLocked() int {
	best := 0
	for i, w := range s.waiting {
		if w.urgency < s.waiting[best].urgency {
			best = i
		}
	}
	return best
}

// sharedSnapshot is what /mulligan/stats and the metrics show of a pool's shared seats.
type sharedSnapshot struct {
	Limit   int    `json:"limit"`
	Held    int    `json:"held_by_replica"`
	Fleet   *int   `json:"held_by_fleet,omitempty"` // nil when the storage did not answer
	Waiting [8]int `json:"waiting_by_urgency"`
}

// snapshot reads the shared seats: this replica's, and the fleet's from the storage.
func (s *sharedSeats) snapshot() sharedSnapshot {
	s.mu.Lock()
	out := sharedSnapshot{Limit: int(s.limit.Load()), Held: len(s.held)}
	for _, w := range s.waiting {
		out.Waiting[min(max(w.urgency, 0), 7)]++
	}
	s.mu.Unlock()
	if n, err := s.st.SeatsHeld(s.name); err == nil {
		out.Fleet = &n
	}
	return out
}

// poll looks for a free shared seat while anyone waits, one look at a time: a seat found goes
// to the most urgent waiter; a look that finds none fails the waiters it covered whose deadline
// passed; a storage failure fails every waiter it covered (shared seats fail closed).
func (s *sharedSeats) poll() {
	for {
		s.mu.Lock()
		if len(s.waiting) == 0 {
			s.polling = false
			s.mu.Unlock()
			return
		}
		s.looks++
		look := s.looks
		s.mu.Unlock()
		id, until := newID("seat_", time.Now()), time.Now().Add(s.lease)
		// A seat taken whose answer was lost (err) is held by no call: it lapses unrenewed.
		ok, err := s.st.AcquireSeat(s.name, id, s.worker, int(s.limit.Load()), until)
		s.mu.Lock()
		switch {
		case ok && len(s.waiting) > 0:
			s.answerLocked(s.mostUrgentLocked(), sharedGrant{seat: s.holdLocked(id, until)})
		case ok: // its waiter left meanwhile
			go s.release(id, until)
		default:
			now := time.Now()
			for i := 0; i < len(s.waiting); i++ {
				if w := s.waiting[i]; w.after < look && (err != nil || !w.deadline.IsZero() && !now.Before(w.deadline)) {
					s.answerLocked(i, sharedGrant{err: errOr(err, errNoSeat)})
					i--
				}
			}
		}
		wait := s.nextLookLocked(ok)
		s.mu.Unlock()
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-s.kick:
				t.Stop()
			}
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
func (s *sharedSeats) nextLookLocked(found bool) time.Duration {
	if found || len(s.waiting) == 0 {
		return 0
	}
	wait := sharedPoll
	for _, w := range s.waiting {
		if !w.deadline.IsZero() {
			wait = min(wait, max(time.Until(w.deadline), 0))
		}
	}
	return wait
}

// holdLocked notes seat id as held by a call until `until`, renewed from now on.
func (s *sharedSeats) holdLocked(id string, until time.Time) *heldSeat {
	h := &heldSeat{id: id, until: until}
	s.held[id] = h
	s.armLocked(h)
	if !s.renewing {
		s.renewing = true
		go s.renew()
	}
	return h
}

// armLocked (re)sets h's timer to cut its call leaseMargin before its lease ends, whether or
// not a renewal ever answers (as an operation's lease does, module/lease.go).
func (s *sharedSeats) armLocked(h *heldSeat) {
	wait := time.Until(h.until.Add(-leaseMargin(s.lease)))
	if h.expiry != nil {
		h.expiry.Reset(wait)
		return
	}
	h.expiry = time.AfterFunc(wait, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.held[h.id] == h && time.Now().After(h.until.Add(-leaseMargin(s.lease))) {
			s.log.Warn("cutting a call whose shared seat could not be renewed", zap.String("seat", h.id))
			s.lapseLocked(h)
		}
	})
}

// lapseLocked stops renewing h and cuts its call: its seat lapses, or is taken by another
// replica, while the call ends.
func (s *sharedSeats) lapseLocked(h *heldSeat) {
	delete(s.held, h.id)
	h.expiry.Stop()
	h.lapsed = true
	if h.cut != nil {
		h.cut(errSeatLapsed)
	}
}

// watch returns ctx, canceled with errSeatLapsed when h can no longer be renewed before it
// lapses; stop ends the watch.
func (s *sharedSeats) watch(ctx context.Context, h *heldSeat) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	s.mu.Lock()
	if h.lapsed {
		cancel(errSeatLapsed)
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

// give returns a shared seat: it is no longer renewed, and released (see release).
func (s *sharedSeats) give(h *heldSeat) {
	s.mu.Lock()
	if s.held[h.id] == h {
		delete(s.held, h.id)
		h.expiry.Stop()
	}
	until := h.until
	s.mu.Unlock()
	s.release(h.id, until)
}

// Retrying a release that failed: until the seat's lease ends, after which it has lapsed.
const (
	releaseRetryBase = 50 * time.Millisecond
	releaseRetryMax  = time.Second
)

// release deletes seat id, held until `until` at most, and wakes the poller for the seat it
// frees. A failed release is retried in the background until the seat's lease ends; it is
// renewed by no one, so it lapses then whatever happens.
func (s *sharedSeats) release(id string, until time.Time) {
	if s.releaseOnce(id) {
		return
	}
	go func() {
		for wait := releaseRetryBase; time.Now().Add(wait).Before(until); wait = min(2*wait, releaseRetryMax) {
			time.Sleep(wait)
			if s.releaseOnce(id) {
				return
			}
		}
	}()
}

func (s *sharedSeats) releaseOnce(id string) bool {
	if err := s.st.ReleaseSeat(s.name, id); err != nil {
		s.log.Warn("releasing a shared seat; retrying until its lease ends", zap.String("seat", id), zap.Error(err))
		return false
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return true
}

// renew extends the seats this replica's calls hold while any is held, every renewEvery: those
// it could not renew (they lapsed, another replica may have taken their place) have their
// calls cut at once; while renewals fail, each seat's timer cuts its call before it lapses.
func (s *sharedSeats) renew() {
	for {
		time.Sleep(renewEvery(s.lease))
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
		asked := time.Now()
		renewed, err := s.st.RenewSeats(s.name, s.worker, ids, asked.Add(s.lease))
		if err != nil {
			s.log.Warn("renewing shared seats", zap.Int("seats", len(ids)), zap.Error(err))
			continue
		}
		s.renewed(ids, renewed, asked.Add(s.lease))
	}
}

// renewed applies a renewal of ids: the renewed ones hold until `until`, the others lapsed.
func (s *sharedSeats) renewed(ids, renewed []string, until time.Time) {
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

// sharedFor finds the shared seats of p once its storage is open: nil without `shared`, or
// before the storage has started.
func (p *seatPool) sharedFor() *sharedSeats {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.Shared == 0 {
		return nil
	}
	if p.shared != nil {
		p.shared.limit.Store(int64(p.cfg.Shared))
		return p.shared
	}
	openStorages.Range(func(_, v any) bool {
		s, ok := v.(*storage)
		if !ok || s.set.where() != p.where {
			return true
		}
		if ss, ok := s.be.(store.SharedSeats); ok {
			p.shared = newSharedSeats(ss, p.sharedName, s.run.worker, p.cfg.Shared, s.run.config().takeover, s.run.log)
		}
		return false
	})
	return p.shared
}

// sharedSnapshot reads p's shared seats; nil without `shared` (or before its storage opened).
func (p *seatPool) sharedSnapshot() *sharedSnapshot {
	s := p.sharedFor()
	if s == nil {
		return nil
	}
	snap := s.snapshot()
	return &snap
}

package capacity

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Seats is one upstream's seats in this process (Pool: the local seats and the one order their
// waiters are served in), with the shared seats among replicas when the block has `shared`: a
// call holds a local seat, and a shared one too when there are shared seats (docs/capacity.md).
type Seats struct {
	*Pool
	clock    clockwork.Clock
	sharedOf func() *Shared
	onFree   func()
	waited   func(time.Duration)
}

// SeatsOptions are what a pool of seats is told of the world around it.
type SeatsOptions struct {
	Clock clockwork.Clock
	// Shared finds the shared seats a call takes besides its local one; nil, or returning nil,
	// when there are none (no `shared`, or its storage has not started). It is asked at every
	// take, since a reload may add or drop `shared`.
	Shared func() *Shared
	// OnFree is called after a seat came back: work queued for one may take it.
	OnFree func()
	// Waited is told how long each wait for a local seat took, including waits that got none.
	Waited func(time.Duration)
}

// NewSeats returns a pool of cfg's local seats.
func NewSeats(cfg Config, o SeatsOptions) *Seats {
	s := &Seats{Pool: NewPool(o.Clock, cfg), clock: o.Clock, sharedOf: o.Shared, onFree: o.OnFree, waited: o.Waited}
	if s.sharedOf == nil {
		s.sharedOf = func() *Shared { return nil }
	}
	if s.onFree == nil {
		s.onFree = func() {}
	}
	if s.waited == nil {
		s.waited = func(time.Duration) {}
	}
	return s
}

// Clock is the clock the seats' waits and deadlines are read on.
func (p *Seats) Clock() clockwork.Clock { return p.clock }

// Shares reports whether a take of these seats also takes a shared one (`shared`, once its
// storage has started).
func (p *Seats) Shares() bool { return p.sharedOf() != nil }

// Seat is one held seat: a local one, and a shared one with `shared`. Release or GiveBack
// returns it, once.
type Seat struct {
	seats  *Seats
	w      *Waiter // the waiter it was granted to; nil for a seat taken without waiting
	start  time.Time
	once   sync.Once
	shared *Held   // the shared seat also held; nil without
	from   *Shared // where shared came from: a reload may drop `shared` while it is held
}

// Seated is a local seat taken at start outside Acquire, as a Seat to give back: granted to
// waiter w after its Await, or taken without waiting (TryTake) when w is nil.
func (p *Seats) Seated(w *Waiter, start time.Time) *Seat { return &Seat{seats: p, w: w, start: start} }

// Of reports whether s is one of p's seats; a nil pool has none.
func (s *Seat) Of(p *Seats) bool { return p != nil && s.seats == p }

// Start is when the seat's call started.
func (s *Seat) Start() time.Time { return s.start }

// Begin notes when the seat's call starts: the adaptive limit learns the latency from then.
func (s *Seat) Begin(at time.Time) { s.start = at }

// Acquire waits for a seat in the pool's order, up to wait (zero: until ctx ends), then for a
// shared one too when there are shared seats, within the same wait.
func (p *Seats) Acquire(ctx context.Context, ask Ask, wait time.Duration) (*Seat, error) {
	var deadline time.Time
	if wait > 0 {
		deadline = p.clock.Now().Add(wait)
	}
	s, err := p.await(ctx, p.Enqueue(ask), wait)
	if err != nil {
		return nil, err
	}
	return p.WithShared(ctx, s, ask, deadline)
}

// WithShared adds a shared seat to local seat s when there are shared seats, waiting no later
// than deadline (zero: until ctx ends). When none is free at once, or other calls of this
// replica already wait for one, the local seat goes back while the call waits for a shared
// one, so that it holds no seat an urgent call of this replica needs, and is taken again, in
// ask's place, once the shared seat is (docs/capacity.md).
func (p *Seats) WithShared(ctx context.Context, s *Seat, ask Ask, deadline time.Time) (*Seat, error) {
	shared := p.sharedOf()
	if shared == nil {
		return s, nil
	}
	now := p.clock.Now()
	urgency := ask.Band(now)
	// With nobody waiting here, one look holding the local seat: a shared seat free now is
	// taken with it. With calls waiting, the local seat goes back at once: holding it for a
	// look would keep it from the call that wins the next shared seat, which then holds the
	// fleet's seat idle while it waits for a local one (and a call that goes before those
	// waiting is looked for at once all the same: Take).
	if shared.waiters() == 0 {
		h, err := shared.Take(ctx, now, urgency, keyOf(ask), weightOf(ask)) // one look
		if err == nil {
			s.shared, s.from = h, shared
			return s, nil
		}
		if !errors.Is(err, ErrNoSeat) {
			// The storage failed: the seat goes back to whoever waits for it, and queued work is
			// not told of it, since its next claim would fail the same way at once, and again.
			s.GiveBackUnwanted()
			return nil, err
		}
	}
	s.GiveBack()
	h, err := shared.Take(ctx, deadline, urgency, keyOf(ask), weightOf(ask))
	if err != nil {
		return nil, err
	}
	var wait time.Duration
	if !deadline.IsZero() {
		wait = max(p.clock.Until(deadline), time.Millisecond)
	}
	local, err := p.await(ctx, p.Enqueue(ask), wait)
	if err != nil {
		shared.Give(h)
		return nil, err
	}
	local.shared, local.from = h, shared
	return local, nil
}

// await waits for w's seat up to wait (zero: until ctx ends); on failure w leaves the order.
func (p *Seats) await(ctx context.Context, w *Waiter, wait time.Duration) (*Seat, error) {
	began := p.clock.Now()
	defer func() { p.waited(p.clock.Since(began)) }()
	start, err := p.Await(ctx, w, wait)
	if err != nil {
		return nil, err
	}
	return p.Seated(w, start), nil
}

// Watch returns ctx for the call holding s: canceled with ErrSeatLapsed when its shared seat
// can no longer be renewed before its lease ends, since another replica may then take it
// (docs/capacity.md). stop ends the watch; without a shared seat ctx is returned as it is.
func (s *Seat) Watch(ctx context.Context) (_ context.Context, stop func()) {
	if s.shared == nil {
		return ctx, func() {}
	}
	return s.from.Watch(ctx, s.shared)
}

// Release gives the seat back, telling the adaptive limit how the call went (docs/capacity.md,
// "limit auto").
func (s *Seat) Release(sample Sample) {
	s.once.Do(func() {
		if s.shared != nil {
			// After the local seat is back: a failed give must not leak it.
			defer s.from.Give(s.shared)
		}
		s.seats.Release(s.w, s.start, sample)
		s.seats.onFree() // a seat may be free for queued work
	})
}

// GiveBack returns a seat that was never used for a call, shared seat included: it tells the
// limit nothing, and OnFree that queued work may take it. A nil seat is none.
func (s *Seat) GiveBack() { s.giveBack(true) }

// GiveBackUnwanted is GiveBack for a seat taken for queued work that was not there (a claim
// that found the queue empty): OnFree is not told, since the seat was free before it was taken
// and the claim that took it saw nothing to claim. Telling it woke the claimers, whose next
// claim took the free seat again, found nothing again and gave it back again, without end.
// Work queued meanwhile wakes the claimers itself, and a call waiting for the seat gets it from
// the pool either way.
func (s *Seat) GiveBackUnwanted() { s.giveBack(false) }

func (s *Seat) giveBack(tell bool) {
	if s == nil {
		return
	}
	s.once.Do(func() {
		if s.shared != nil {
			defer s.from.Give(s.shared)
		}
		s.seats.Pool.GiveBack(s.w)
		if tell {
			s.seats.onFree()
		}
	})
}

// Detach unbinds the seat from the waiter it was granted to, when it goes to other work than
// that waiter's (the queue's head it stood in for was claimed elsewhere, and the next head takes
// it): the waiter's key is charged the least a turn costs, and the seat's time is charged to no
// key.
func (s *Seat) Detach() {
	if s == nil || s.w == nil {
		return
	}
	s.seats.Pool.Detach(s.w)
	s.w = nil
}

// Shared reports whether the seat holds a shared seat too.
func (s *Seat) Shared() bool { return s.shared != nil }

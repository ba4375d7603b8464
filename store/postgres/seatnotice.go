package postgres

import (
	"context"
	"sync"

	"github.com/mulligan-gw/mulligan/store"
)

// Freed shared seats are told to the replicas at once (docs/capacity.md, "Many replicas"): a
// replica whose calls wait for a shared seat otherwise finds one freed by another replica only
// at its next look, up to 20 ms later, and the model server's slot stays idle meanwhile. As the
// wake-ups of work, a notice is a hint sent after the release's commit, on its own, by one
// notifier for all pools (a notifying transaction serialises every notifying commit of the
// cluster); the waiters still look on their own, so a lost notice costs only the wait for the
// next look.

// seatsChannel is the NOTIFY channel of freed shared seats; the payload names the pool.
const seatsChannel = "mulligan_seats"

// The Store tells the replicas of seats freed.
var _ store.SeatNotices = (*Store)(nil)

// seatNotices holds the pools whose freed seats are still to be told, and the channels of the
// pools whose waiters listen here.
type seatNotices struct {
	mu      sync.Mutex
	pending map[string]struct{}
	kick    chan struct{}
	freed   map[string]chan struct{}
}

func newSeatNotices() *seatNotices {
	return &seatNotices{pending: map[string]struct{}{}, kick: make(chan struct{}, 1), freed: map[string]chan struct{}{}}
}

// SeatsFreed receives when a seat of pool may have come free on any replica (see
// store.SeatNotices).
func (s *Store) SeatsFreed(pool string) <-chan struct{} {
	n := s.seats
	n.mu.Lock()
	defer n.mu.Unlock()
	ch := n.freed[pool]
	if ch == nil {
		ch = make(chan struct{}, 1)
		n.freed[pool] = ch
	}
	return ch
}

// heardFreed passes on a notice of a seat of pool freed.
func (n *seatNotices) heardFreed(pool string) {
	n.mu.Lock()
	ch := n.freed[pool]
	n.mu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// heardAll passes on a notice to every pool: notices sent while no one listened are lost.
func (n *seatNotices) heardAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ch := range n.freed {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// maxNoticePool bounds the pool names told: a NOTIFY payload is under 8,000 bytes, and one that
// is not fails the statement telling every pool noted with it. A longer name is not told; its
// waiters look on their own.
const maxNoticePool = 1000

// note notes that a seat of pool came free, for the notifier to tell.
func (n *seatNotices) note(pool string) {
	if len(pool) > maxNoticePool {
		return
	}
	n.mu.Lock()
	n.pending[pool] = struct{}{}
	n.mu.Unlock()
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// seatNotifier tells the replicas of the pools noted, in one statement for all of them, until
// Close; notes made while a statement is under way are told by the next.
func (s *Store) seatNotifier() {
	defer s.bg.Done()
	n := s.seats
	for {
		select {
		case <-s.base.Done():
			return
		case <-n.kick:
		}
		n.mu.Lock()
		pools := make([]string, 0, len(n.pending))
		for p := range n.pending {
			pools = append(pools, p)
		}
		clear(n.pending)
		n.mu.Unlock()
		ctx, cancel := context.WithTimeout(s.base, s.opts.Timeout)
		if _, err := s.pool.Exec(ctx, `SELECT pg_notify('`+seatsChannel+`', p) FROM `+noticeCommit+`, unnest($1::text[]) p`, pools); err != nil && s.base.Err() == nil {
			s.logf("postgres: telling the replicas of freed seats: %v", err) // they look on their own meanwhile
		}
		cancel()
	}
}

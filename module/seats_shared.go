package module

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
)

// sharedSeats is a pool's share of the seats every replica on one PostgreSQL storage holds
// together (capacity `shared N`, docs/capacity.md). A call takes a local seat first, then one
// of the N shared ones; its replica renews its shared seats while it lives, so a replica that
// dies gives them back when its lease lapses (`takeover`).
type sharedSeats struct {
	st     store.SharedSeats
	name   string // the pool's name in storage: the same on every replica
	worker string
	limit  atomic.Int64 // N of `shared N`; a reload may change it
	lease  time.Duration
	log    *zap.Logger

	once sync.Once
	stop chan struct{}
}

// sharedPoll paces the look for a shared seat held by another replica.
const sharedPoll = 20 * time.Millisecond

// take waits for a shared seat until ctx ends or deadline (zero: none); it returns the seat.
func (s *sharedSeats) take(ctx context.Context, deadline time.Time) (string, error) {
	s.once.Do(func() { go s.renew() })
	id := newID("seat_", time.Now())
	for {
		ok, err := s.st.AcquireSeat(s.name, id, s.worker, int(s.limit.Load()), time.Now().Add(s.lease))
		if err != nil {
			return "", err
		}
		if ok {
			return id, nil
		}
		wait := sharedPoll
		if !deadline.IsZero() {
			if left := time.Until(deadline); left <= 0 {
				return "", errNoSeat
			} else if left < wait {
				wait = left
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", context.Cause(ctx)
		}
	}
}

// give returns a shared seat.
func (s *sharedSeats) give(id string) {
	if err := s.st.ReleaseSeat(s.name, id); err != nil {
		s.log.Warn("releasing a shared seat; it lapses after takeover", zap.Error(err))
	}
}

// renew keeps this replica's shared seats alive until the pool is let go.
func (s *sharedSeats) renew() {
	t := time.NewTicker(renewEvery(s.lease))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if err := s.st.RenewSeats(s.name, s.worker, time.Now().Add(s.lease)); err != nil {
				s.log.Warn("renewing shared seats", zap.Error(err))
			}
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
			p.shared = &sharedSeats{st: ss, name: p.sharedName, worker: s.run.worker,
				lease: s.run.config().takeover, log: s.run.log, stop: p.stopped}
			p.shared.limit.Store(int64(p.cfg.Shared))
		}
		return false
	})
	return p.shared
}

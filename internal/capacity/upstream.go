package capacity

import (
	"sync"
)

// Upstream is one upstream's seats in this process, as a block's config and its storage set them
// up (docs/capacity.md, "Seats"): the local pool, the model server's metrics while they are
// configured, and the seats shared with other replicas once the storage has started.
type Upstream struct {
	*Seats
	opts UpstreamOptions

	mu          sync.Mutex
	watchCfg    *WatchConfig
	watch       *ServerWatch // reads the model server's metrics; nil without
	sharedLimit int          // `shared N`; 0 without
	shared      *Shared      // nil until first needed, or without shared
}

// UpstreamOptions are what an Upstream is given to do its work.
type UpstreamOptions struct {
	// Seats are the local pool's options; its Shared is the Upstream's.
	Seats SeatsOptions
	// Watch are the options of the reads of the model server's metrics.
	Watch WatchOptions
	// FindShared returns the shared seats of limit once the storage that holds them has started;
	// nil before, or when the storage shares no seats.
	FindShared func(limit int) *Shared
}

// NewUpstream returns an upstream's seats of cfg, without metrics or shared seats until
// Configure sets them.
func NewUpstream(cfg Config, o UpstreamOptions) *Upstream {
	u := &Upstream{opts: o}
	o.Seats.Shared = u.SharedSeats
	u.Seats = NewSeats(cfg, o.Seats)
	return u
}

// Configure applies a (re)loaded block's settings: its local seats, its model server's metrics
// (nil: none; read again from scratch when they changed) and its `shared N` (0: none). Seats in
// use stay in use.
func (u *Upstream) Configure(cfg Config, watch *WatchConfig, shared int) {
	u.mu.Lock()
	var stopped *ServerWatch
	if u.watch != nil && (watch == nil || u.watchCfg == nil || *watch != *u.watchCfg) {
		stopped, u.watch = u.watch, nil
	}
	if u.watch == nil && watch != nil {
		u.watch = StartServerWatch(u.Pool, *watch, u.opts.Watch)
	}
	u.watchCfg, u.sharedLimit = watch, shared
	u.mu.Unlock()
	if stopped != nil {
		stopped.Close()
	}
	u.Seats.Configure(sharedFloor(cfg, shared))
}

// sharedFloor is the local config cfg under `shared N` (0: none): an adaptive limit goes no
// lower than N (nor above its Max). A replica may win any of the N seats, and a call that won
// one takes a local seat next: below N the local limit held the fleet's seat idle while the call
// waited for one of its replica's calls to end (docs/capacity.md, "Sizing limit against
// shared"). The shared seats bound the model server's load; a fixed limit is the operator's.
func sharedFloor(cfg Config, shared int) Config {
	if cfg.Auto && shared > 0 {
		cfg.Min = max(cfg.Min, min(shared, cfg.Max))
	}
	return cfg
}

// Watching reports whether the upstream's model server's metrics are read.
func (u *Upstream) Watching() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.watch != nil
}

// SharedSeats returns the seats shared with other replicas: nil without `shared`, or before
// the storage has started.
func (u *Upstream) SharedSeats() *Shared {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sharedLimit == 0 {
		return nil
	}
	if u.shared == nil && u.opts.FindShared != nil {
		u.shared = u.opts.FindShared(u.sharedLimit)
	}
	if u.shared != nil {
		u.shared.SetLimit(u.sharedLimit)
	}
	return u.shared
}

// UseShared makes the upstream take its shared seats from s, limit at a time (nil: none), in
// place of those its storage would give it. For tests: the local limit is left as configured
// (Configure raises an adaptive one's minimum to `shared N`: sharedFloor).
func (u *Upstream) UseShared(s *Shared, limit int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.shared, u.sharedLimit = s, limit
	if s == nil {
		u.sharedLimit = 0
	}
}

// SharedSnapshot reads the shared seats; nil without them.
func (u *Upstream) SharedSnapshot() *SharedSnapshot {
	s := u.SharedSeats()
	if s == nil {
		return nil
	}
	snap := s.Snapshot()
	return &snap
}

// Close stops reading the model server's metrics. Calls still holding shared seats keep them
// renewed until they end: the renewer runs while any seat is held.
func (u *Upstream) Close() {
	u.mu.Lock()
	w := u.watch
	u.watch = nil
	u.mu.Unlock()
	if w != nil {
		w.Close()
	}
}

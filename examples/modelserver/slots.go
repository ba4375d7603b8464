package modelserver

import (
	"container/list"
	"context"
	"time"
)

// HeaderQueueWait is the response header saying how long the request waited
// for one of Config.Slots inside the server before it began (a Go duration,
// "0s" when a slot was free). It is set on every model request that got past
// validation, also without slots.
const HeaderQueueWait = "X-Queue-Wait"

// slotWaiter is a model request waiting for a slot, in the queue in arrival
// order. granted and wait are written by the request that hands its slot
// over, under Server.mu, before seated is closed.
type slotWaiter struct {
	id      int64
	since   time.Time
	seated  chan struct{}
	granted bool
	wait    time.Duration
}

// slotCounters are the gauges and integrals of the slots, guarded by
// Server.mu. The integrals (busy, queuedTime) are advanced to the current
// time before every change of the gauges they integrate, so that a snapshot
// is exact at the moment it is taken.
type slotCounters struct {
	waiting  list.List // of *slotWaiter, oldest first
	running  int64     // requests holding a slot (every request past validation without slots)
	lastTick time.Time // the integrals are up to date until this time
	since    time.Time // start of the window: New or the last Reset

	maxInFlight, maxRunning, maxQueued int64
	busy, queuedTime                   time.Duration
	seatedCount                        int64
	waitTotal, waitMax                 time.Duration
}

// advanceLocked brings the integrals up to now. s.mu must be held.
func (s *Server) advanceLocked(now time.Time) {
	c := &s.slots
	if dt := now.Sub(c.lastTick); dt > 0 {
		c.busy += time.Duration(c.running) * dt
		c.queuedTime += time.Duration(c.waiting.Len()) * dt
		c.lastTick = now
	}
}

// takeSlot waits, first come first served, until the request holds one of
// Config.Slots (at once when Slots is 0 or a slot is free), and returns how
// long it waited. It reports false, holding no slot, when ctx ended first.
// The slot is given back by e.settle.
func (s *Server) takeSlot(ctx context.Context, e *execution) (time.Duration, bool) {
	s.mu.Lock()
	now := time.Now() // under the lock, so that the integrals and the waits use one timeline
	s.advanceLocked(now)
	c := &s.slots
	if s.cfg.Slots <= 0 || c.running < int64(s.cfg.Slots) {
		c.running++
		c.maxRunning = max(c.maxRunning, c.running)
		s.recordWaitLocked(0)
		s.seatedLocked(e.id)
		e.seated = true
		s.mu.Unlock()
		return 0, true
	}
	w := &slotWaiter{id: e.id, since: now, seated: make(chan struct{})}
	elem := c.waiting.PushBack(w)
	c.maxQueued = max(c.maxQueued, int64(c.waiting.Len()))
	s.mu.Unlock()

	select {
	case <-w.seated:
	case <-ctx.Done():
		s.mu.Lock()
		if !w.granted { // still queued: leave the queue, the client is gone
			s.advanceLocked(time.Now())
			c.waiting.Remove(elem)
			s.mu.Unlock()
			return 0, false
		}
		s.mu.Unlock() // seated in the meantime: settle gives the slot back
	}
	e.seated = true
	return w.wait, true
}

// releaseSlotLocked gives the slot of a settled request to the oldest
// waiting request, or frees it. s.mu must be held.
func (s *Server) releaseSlotLocked(now time.Time) {
	s.advanceLocked(now)
	c := &s.slots
	front := c.waiting.Front()
	if front == nil {
		c.running--
		return
	}
	w := c.waiting.Remove(front).(*slotWaiter)
	w.granted, w.wait = true, now.Sub(w.since)
	s.recordWaitLocked(w.wait)
	s.seatedLocked(w.id)
	close(w.seated)
}

// recordWaitLocked counts a request that took a slot after waiting d.
func (s *Server) recordWaitLocked(d time.Duration) {
	c := &s.slots
	c.seatedCount++
	c.waitTotal += d
	c.waitMax = max(c.waitMax, d)
}

// seatedLocked tells the test hook, if any, that request id took a slot.
// It runs under s.mu, so the hook sees the seats in the order they were
// given. s.mu must be held.
func (s *Server) seatedLocked(id int64) {
	if s.onSeated != nil {
		s.onSeated(id)
	}
}

// resetSlotsLocked starts a new window: the integrals and totals restart
// from zero and the maxima from the current gauges. s.mu must be held.
func (s *Server) resetSlotsLocked(now time.Time) {
	s.advanceLocked(now)
	c := &s.slots
	c.since = now
	c.busy, c.queuedTime = 0, 0
	c.seatedCount, c.waitTotal, c.waitMax = 0, 0, 0
	c.maxInFlight, c.maxRunning, c.maxQueued = s.inFlight, c.running, int64(c.waiting.Len())
}

// fillSlotStatsLocked copies the slot counters into st. s.mu must be held.
func (s *Server) fillSlotStatsLocked(st *Stats, now time.Time) {
	s.advanceLocked(now)
	c := &s.slots
	st.Slots = s.cfg.Slots
	st.Running = c.running
	st.Queued = int64(c.waiting.Len())
	st.MaxInFlight, st.MaxRunning, st.MaxQueued = c.maxInFlight, c.maxRunning, c.maxQueued
	st.BusySlotTime, st.QueuedTime = c.busy, c.queuedTime
	st.Seated, st.QueueWaitTotal, st.QueueWaitMax = c.seatedCount, c.waitTotal, c.waitMax
	st.Window = now.Sub(c.since)
}

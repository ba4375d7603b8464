package modelserver

import "time"

// Stats is a snapshot of the server's execution counters, as returned by
// Server.Stats and GET /stats.
//
// Every model request (a POST to a known model path) is counted in Received,
// ByPath and, when it carries an Idempotency-Key header, ByKey. It then ends in
// exactly one of: Completed (a full response was written, whatever its
// status), Abandoned (the client went away first), or a dropped connection
// (X-Mock-Fail: drop, counted only in Failed). Failed also counts completed
// requests that answered an injected failure status. InFlight is the number of
// requests that have not ended yet: Running ones (holding one of
// Config.Slots, or simply executing without slots) and Queued ones (waiting
// for a slot).
//
// The slot counters describe a window that starts at New or Reset: the
// maxima seen, the time-integrals of Running (BusySlotTime, for
// Utilisation) and of Queued (QueuedTime, for MeanQueued), and the waits of
// the requests seated in it. Sub turns two snapshots into the activity
// between them.
type Stats struct {
	// Received counts model requests that began executing.
	Received int64 `json:"received"`
	// Completed counts model requests that wrote a full response.
	Completed int64 `json:"completed"`
	// Abandoned counts model requests cut short by the client.
	Abandoned int64 `json:"abandoned"`
	// Failed counts injected failures: forced or random error statuses and
	// dropped connections.
	Failed int64 `json:"failed"`
	// InFlight is the number of model requests currently executing. It is
	// a live gauge and is not zeroed by Reset.
	InFlight int64 `json:"in_flight"`
	// ByKey counts executions per Idempotency-Key request header value.
	ByKey map[string]int64 `json:"by_key"`
	// ByPath counts executions per request path.
	ByPath map[string]int64 `json:"by_path"`

	// Slots is Config.Slots: 0 means no limit.
	Slots int `json:"slots"`
	// Running is the number of requests holding a slot now (without slots:
	// executing past validation).
	Running int64 `json:"running"`
	// Queued is the number of requests waiting for a slot now.
	Queued int64 `json:"queued"`
	// MaxInFlight, MaxRunning and MaxQueued are the largest InFlight,
	// Running and Queued seen in the window.
	MaxInFlight int64 `json:"max_in_flight"`
	MaxRunning  int64 `json:"max_running"`
	MaxQueued   int64 `json:"max_queued"`
	// BusySlotTime is the slot time spent running requests in the window:
	// the integral of Running over time.
	BusySlotTime time.Duration `json:"busy_slot_ns"`
	// QueuedTime is the request time spent waiting for a slot in the
	// window: the integral of Queued over time.
	QueuedTime time.Duration `json:"queued_ns"`
	// Seated counts the requests that took a slot in the window;
	// QueueWaitTotal and QueueWaitMax are the sum and the longest of their
	// waits (each request's own wait is its X-Queue-Wait header).
	Seated         int64         `json:"seated"`
	QueueWaitTotal time.Duration `json:"queue_wait_total_ns"`
	QueueWaitMax   time.Duration `json:"queue_wait_max_ns"`
	// Window is the time since New or the last Reset.
	Window time.Duration `json:"window_ns"`
}

// Stats returns a consistent snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Received:  s.received,
		Completed: s.completed,
		Abandoned: s.abandoned,
		Failed:    s.failed,
		InFlight:  s.inFlight,
		ByKey:     make(map[string]int64, len(s.byKey)),
		ByPath:    make(map[string]int64, len(s.byPath)),
	}
	s.fillSlotStatsLocked(&st, time.Now())
	for k, v := range s.byKey {
		st.ByKey[k] = v
	}
	for k, v := range s.byPath {
		st.ByPath[k] = v
	}
	return st
}

// Reset zeroes the counters and starts a new window of the slot counters.
// Requests still in flight keep counting in InFlight, Running and Queued but
// their outcome is not recorded in the new counters. The execution sequence
// is not reset, so execution ids never repeat.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resetSlotsLocked(time.Now())
	s.epoch++
	s.received, s.completed, s.abandoned, s.failed = 0, 0, 0, 0
	s.byKey = map[string]int64{}
	s.byPath = map[string]int64{}
}

// Utilisation is the share of the slots' time spent running requests over
// the window: BusySlotTime / (Slots × Window). It is 0 without slots.
func (st Stats) Utilisation() float64 {
	if st.Slots <= 0 || st.Window <= 0 {
		return 0
	}
	return float64(st.BusySlotTime) / (float64(st.Slots) * float64(st.Window))
}

// MeanQueued is the average number of requests waiting for a slot over the
// window.
func (st Stats) MeanQueued() float64 {
	if st.Window <= 0 {
		return 0
	}
	return float64(st.QueuedTime) / float64(st.Window)
}

// Sub is the activity between an earlier snapshot (taken after the same
// Reset) and st: the integrals, totals and window are differences, so
// st.Sub(earlier).Utilisation() is the utilisation between the two; gauges
// and maxima are st's own (the maxima still count from the last Reset).
func (st Stats) Sub(earlier Stats) Stats {
	d := st
	d.BusySlotTime -= earlier.BusySlotTime
	d.QueuedTime -= earlier.QueuedTime
	d.Window -= earlier.Window
	d.Seated -= earlier.Seated
	d.QueueWaitTotal -= earlier.QueueWaitTotal
	return d
}

package main

import (
	"context"
	"fmt"
	"time"
)

// The pace scenario: keyed streamed calls at a model server's pace, open loop (PaceRate calls a
// second, each a stream of paceEvents events spread over PaceStream), measuring the time to the
// first event of each, and what Mulligan adds to it over plain Caddy at p50 and p99. The upstream
// sends its first event at once, so the time to it is the gateway's own: the claim of the key,
// the stream's recording opened, the relay. The other streams live meanwhile (about PaceRate ×
// PaceStream at once) are the load it is paid under.
const (
	ScenarioPace = "pace"
	paceEvents   = 20
)

// pace runs the scenario's rounds on every gateway, interleaved.
func (h *harness) pace(ctx context.Context) ([]Row, error) {
	every := h.cfg.PaceStream / paceEvents
	shape := streamShape{events: paceEvents, size: ttfbSize, every: every}
	live := int(h.cfg.PaceRate * h.cfg.PaceStream.Seconds())
	maxInFlight := 2*live + 64
	call := func(ctx context.Context, base string, seq int64, _ time.Time) (time.Duration, error) {
		key := fmt.Sprintf("%s-pace-%d", h.runID, seq)
		first, _, n, err := h.readStream(ctx, base, key, shape, nil)
		if err == nil && n != paceEvents {
			err = fmt.Errorf("got %d of %d events", n, paceEvents)
		}
		return first, err
	}
	plain, mull, err := h.alternate(ctx, ScenarioPace, func(g *gateway) (sample, error) {
		return openLoopTimed(ctx, h.cfg.PaceRate, h.cfg.Duration, maxInFlight, g, &h.seq, call), nil
	})
	row := Row{Scenario: fmt.Sprintf("stream at a model server's pace: time to first event (%.0f/s of %s streams, new key)", h.cfg.PaceRate, h.cfg.PaceStream),
		Plain: resultOf(plain), Mulligan: resultsOf(mull), Note: "req/s: streams/s; p50/p99: time to the first event; " + added(h.mulligans, plain, mull)}
	return []Row{row}, err
}

// added says, for each Mulligan side, how much later than through plain Caddy the first event
// came, at p50 and at p99 (each a difference of percentiles of the two sides' samples).
func added(sides []*gateway, plain sample, mull []sample) string {
	out := ""
	for i := range mull {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%s adds %s at p50, %s at p99", sides[i].name,
			signed(mull[i].percentile(50)-plain.percentile(50)), signed(mull[i].percentile(99)-plain.percentile(99)))
	}
	return out
}

// signed is fmtDuration of d with its sign, to the microsecond.
func signed(d time.Duration) string {
	sign := "+"
	if d < 0 {
		sign, d = "-", -d
	}
	if d < time.Microsecond {
		return sign + "0µs"
	}
	return sign + fmtDuration(d)
}

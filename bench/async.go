package main

import (
	"context"
	"fmt"
	"time"
)

// doneTimeout bounds the wait for a batch of operations to finish.
const doneTimeout = 3 * time.Minute

// async measures durable async conversion three ways: accept throughput (time to 202), end to
// end (submit N operations, poll until all are done) and accept latency at half the peak rate.
func (h *harness) async(ctx context.Context) ([]Row, error) {
	acceptRow, peak, err := h.asyncAccept(ctx)
	if err != nil {
		return nil, err
	}
	e2eRow, err := h.asyncEndToEnd(ctx)
	if err != nil {
		return []Row{acceptRow}, err
	}
	halfRow, err := h.asyncHalfRate(ctx, peak/2)
	return []Row{acceptRow, e2eRow, halfRow}, err
}

// acceptRound is one round of fn on g; after a Mulligan round it waits for the runner to
// finish what the round queued, outside the measurement.
func (h *harness) acceptRound(ctx context.Context, g *gateway, newest *newestOp, measure func() sample) (sample, error) {
	s := measure()
	if g != h.plain {
		return s, h.drain(ctx, g, newest.take())
	}
	return s, nil
}

// asyncAccept is the closed-loop accept throughput; it returns the Mulligan peak rate too.
func (h *harness) asyncAccept(ctx context.Context) (Row, float64, error) {
	newest := &newestOp{}
	fn := h.accept(newest)
	plain, mull, err := h.alternate(ctx, "async accept", func(g *gateway) (sample, error) {
		return h.acceptRound(ctx, g, newest, func() sample {
			return closedLoop(ctx, h.cfg.Concurrency, h.cfg.Duration, int64(h.cfg.AsyncOps), g, &h.seq, fn)
		})
	})
	row := Row{Scenario: "async accept (Prefer: respond-async)", Plain: resultOf(plain), Mulligan: resultsOf(mull),
		Note: "time to 202; plain: same request proxied (200)"}
	return row, peakOf(mull), err
}

// peakOf is the lowest rate of the Mulligan sides, so that half of it is below every side's
// peak.
func peakOf(mull []sample) float64 {
	peak := 0.0
	for i := range mull {
		if r := mull[i].rps(); i == 0 || r < peak {
			peak = r
		}
	}
	return peak
}

// asyncEndToEnd submits Operations operations and polls until every one is done; plain Caddy
// runs the same number of synchronous calls.
func (h *harness) asyncEndToEnd(ctx context.Context) (Row, error) {
	n := h.cfg.Operations
	plain, mull, err := h.alternate(ctx, "async end to end", func(g *gateway) (sample, error) {
		if g == h.plain {
			chat := h.chat()
			return forEach(ctx, h.cfg.Concurrency, n, func(int) error { return chat(ctx, g.base, h.seq.Add(1)) }), nil
		}
		return h.submitAndAwait(ctx, g, n), nil
	})
	row := Row{Scenario: fmt.Sprintf("async end to end (%d ops)", n), Plain: resultOf(plain), Mulligan: resultsOf(mull),
		Note: "ops/s, submit to done (polled); plain: same calls synchronously"}
	return row, err
}

// submitAll submits n operations to g, remembering when each was sent; an operation that
// was not accepted has an empty id.
func (h *harness) submitAll(ctx context.Context, g *gateway, n int, label string) ([]submission, sample) {
	subs := make([]submission, n)
	sub := forEach(ctx, h.cfg.Concurrency, n, func(i int) error {
		at := time.Now()
		n := h.seq.Add(1)
		id, err := h.submit(ctx, g.pick(n), fmt.Sprint(label, n))
		subs[i] = submission{id: id, at: at}
		return err
	})
	return subs, sub
}

// submitAndAwait submits n operations to g and waits until all are done.
func (h *harness) submitAndAwait(ctx context.Context, g *gateway, n int) sample {
	start := time.Now()
	subs, sub := h.submitAll(ctx, g, n, "e2e ")
	accepted := subs[:0]
	for _, s := range subs {
		if s.id != "" {
			accepted = append(accepted, s)
		}
	}
	res := h.awaitDone(ctx, g.base, start, accepted, doneTimeout)
	res.errs += sub.errs
	if res.firstErr == "" {
		res.firstErr = sub.firstErr
	}
	return res
}

// asyncHalfRate sends async requests open loop at rate (half the slowest Mulligan side's peak) and reports
// the latency to the answer; plain Caddy gets the same rate of proxied requests.
func (h *harness) asyncHalfRate(ctx context.Context, rate float64) (Row, error) {
	name := fmt.Sprintf("async accept at %.0f/s (half peak, open loop)", rate)
	if rate < 1 {
		return Row{Scenario: name, Note: "skipped: no peak rate measured"}, nil
	}
	newest := &newestOp{}
	fn := h.accept(newest)
	maxInFlight := 4*h.cfg.Concurrency + 64
	d := min(h.cfg.Duration, time.Duration(float64(h.cfg.AsyncOps)/rate*float64(time.Second)))
	plain, mull, err := h.alternate(ctx, "async half rate", func(g *gateway) (sample, error) {
		return h.acceptRound(ctx, g, newest, func() sample {
			return openLoop(ctx, rate, d, maxInFlight, g, &h.seq, fn)
		})
	})
	row := Row{Scenario: name, Plain: resultOf(plain), Mulligan: resultsOf(mull),
		Note: "latency from the scheduled send time"}
	return row, err
}

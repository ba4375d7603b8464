package main

import (
	"fmt"
	"io"
	"time"
)

// FloodRow is one flood (floodKinds) against one side.
type FloodRow struct {
	// Flood is the flood's kind: "sync" (calls held open), "async" (Prefer: respond-async
	// operations), "mixed" (held open, of mixed lengths), "fast-error" (held open beside a
	// tenant's instant 400s), "forged" (the flood claims u=0) or "minted" (a fresh credential
	// per flood call).
	Flood string
	// Side names the gateway: plain Caddy, HAProxy, Mulligan, Mulligan + capacity.
	Side string
	// Missing says why the side was not measured ("n/a: ..." or "not available ...").
	Missing string
	// Unloaded is the side's median interactive call on an idle model server.
	Unloaded time.Duration
	// P50, P90 and P99 are the interactive calls' latencies during the flood, from their
	// scheduled send; Interactive and InteractiveErrors count them.
	P50, P90, P99                  time.Duration
	Interactive, InteractiveErrors int
	// Utilisation is the model server's busy slot time over slots × the time work was waiting
	// (anywhere: in the gateway or in the model server).
	Utilisation float64
	// MeanQueue and MaxQueue are the model server's own queue over that time.
	MeanQueue float64
	MaxQueue  int64
	// FloodRate is the flood calls done per second, from the first sent to the last done;
	// FloodOK and FloodErrors count them.
	FloodRate            float64
	FloodOK, FloodErrors int
	// FirstError quotes the first unexpected answer, flood or interactive.
	FirstError string
}

// slotTotals is what the model server's counters showed over the time work was waiting.
type slotTotals struct {
	slots                 int
	waiting, busy, queued time.Duration
	maxQueue, maxHeld     int64
}

// fill completes row from the run's samples and the model server's totals.
func (r *floodRun) fill(row *FloodRow, t slotTotals) {
	r.mu.Lock()
	defer r.mu.Unlock()
	row.P50, row.P90, row.P99 = r.inter.percentile(50), r.inter.percentile(90), r.inter.percentile(99)
	row.Interactive, row.InteractiveErrors = r.inter.ok, r.inter.errs
	if t.waiting > 0 && t.slots > 0 {
		row.Utilisation = float64(t.busy) / (float64(t.slots) * float64(t.waiting))
		row.MeanQueue = float64(t.queued) / float64(t.waiting)
	}
	row.MaxQueue = t.maxQueue
	row.FloodOK, row.FloodErrors = r.flood.ok, r.flood.errs
	if d := r.lastDone.Sub(r.start); d > 0 {
		row.FloodRate = float64(r.flood.ok) / d.Seconds()
	}
	row.FirstError = r.flood.firstErr
	if row.FirstError == "" {
		row.FirstError = r.inter.firstErr
	}
}

// printFlood writes the flood table: one line per flood and side.
func printFlood(w io.Writer, cfg Config, rows []FloodRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "flood: a model server with %d slots and %s calls (queueing the rest first come first served); "+
		"one tenant sends %d calls at u=7, %d× its capacity, held open (sync) or as operations (async); "+
		"another sends an interactive call at u=0 every %s until the flood is done\n\n",
		cfg.FloodSlots, cfg.FloodLatency, cfg.FloodCalls, floodFactor, cfg.FloodEvery)
	table := [][]string{{"flood", "side", "unloaded", "interactive p50", "p90", "p99", "p99 ÷ unloaded",
		"slot utilisation while work waits", "model queue mean", "max", "flood calls/s", "notes"}}
	for _, r := range rows {
		if r.Missing != "" {
			table = append(table, []string{r.Flood, r.Side, "–", "–", "–", "–", "–", "–", "–", "–", "–", r.Missing})
			continue
		}
		table = append(table, []string{r.Flood, r.Side, fmtDuration(r.Unloaded),
			fmtDuration(r.P50), fmtDuration(r.P90), fmtDuration(r.P99), floodRatio(r.P99, r.Unloaded),
			fmt.Sprintf("%.0f %%", 100*r.Utilisation), fmt.Sprintf("%.1f", r.MeanQueue), fmt.Sprint(r.MaxQueue),
			fmt.Sprintf("%.1f", r.FloodRate), floodNotes(r)})
	}
	writeMarkdown(w, table)
}

// floodRatio is p99 over the unloaded call time.
func floodRatio(p99, unloaded time.Duration) string {
	if unloaded <= 0 || p99 <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f×", float64(p99)/float64(unloaded))
}

// floodNotes counts the calls that did not end as expected.
func floodNotes(r FloodRow) string {
	note := fmt.Sprintf("%d interactive calls", r.Interactive+r.InteractiveErrors)
	if r.InteractiveErrors > 0 {
		note += fmt.Sprintf(", %d failed", r.InteractiveErrors)
	}
	if r.FloodErrors > 0 {
		note += fmt.Sprintf("; %d of %d flood calls failed", r.FloodErrors, r.FloodOK+r.FloodErrors)
	}
	if r.FirstError != "" {
		note += ", first: " + truncate(r.FirstError, 120)
	}
	return note
}

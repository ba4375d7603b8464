package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// scaleSmallKeys is the size of the first scale measurement.
const scaleSmallKeys = 10_000

// ScaleRow is the Mulligan gateway measured on a store of one size.
type ScaleRow struct {
	// Keys and Operations are what the store held (all recorded, all finished).
	Keys, Operations int
	// Seed is how long seeding this size took (directly through the store, no fsync).
	Seed time.Duration
	// DiskBytes is the store's size on disk when the gateway started.
	DiskBytes int64
	// RSSStart is the gateway's resident memory after its first request; RSSLoaded after the
	// replay load.
	RSSStart, RSSLoaded int64
	// Replay is closed-loop replays of keys spread over the whole store.
	Replay *Result
	// List is the median time of GET /v1/operations?status=queued&limit=1 (an empty answer).
	List time.Duration
	// Async is Operations operations submitted and awaited on this store (ops/s).
	Async *Result
}

// scale seeds a fresh store with scaleSmallKeys keys, measures, grows it to ScaleKeys keys and
// ScaleOps operations, and measures again. Records go straight into the store, before the
// gateway starts, keyed the way the gateway keys them (fingerprint.go).
func (h *harness) scale(ctx context.Context) ([]ScaleRow, error) {
	dir := filepath.Join(h.tmp, "scale")
	storeDir := filepath.Join(dir, "badger")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var rows []ScaleRow
	keys, ops := 0, 0
	for _, size := range [][2]int{{scaleSmallKeys, 0}, {h.cfg.ScaleKeys, h.cfg.ScaleOps}} {
		h.logf("scale: seeding keys %d..%d and %d operations", keys, size[0], size[1]-ops)
		t0 := time.Now()
		if err := seedKeys(ctx, storeDir, keys, size[0]); err != nil {
			return rows, err
		}
		if err := seedOperations(ctx, storeDir, ops, size[1]-ops); err != nil {
			return rows, err
		}
		keys, ops = size[0], size[1]
		row := ScaleRow{Keys: keys, Operations: ops, Seed: time.Since(t0), DiskBytes: dirSize(storeDir)}
		h.logf("scale: seeded in %s, %d MiB on disk", row.Seed.Round(time.Second), row.DiskBytes>>20)
		if err := h.measureScale(ctx, dir, storeDir, &row); err != nil {
			return rows, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// measureScale starts the gateway on the seeded store and measures memory, replay latency,
// the status-filtered operations list and async operations end to end.
func (h *harness) measureScale(ctx context.Context, dir, storeDir string, row *ScaleRow) error {
	g, err := startGateway(ctx, h.binary, dir, "scale", func(int) string { return mulliganSite(h.upstream, storeDir, "") })
	if err != nil {
		return err
	}
	defer g.stop()
	n := uint64(row.Keys)
	// A multiplicative hash spreads consecutive requests over the whole key space.
	keyOf := func(seq int64) string { return scaleKey(int(uint64(seq) * 2654435761 % n)) }
	replay := h.keyed(keyOf, true)
	if err := replay(ctx, g.base, 1); err != nil {
		return fmt.Errorf("a seeded key does not replay (is bench/fingerprint.go in step with module/?): %w", err)
	}
	if row.RSSStart, err = g.rssBytes(); err != nil {
		return err
	}
	var s sample
	for r := range h.cfg.Rounds {
		round := closedLoop(ctx, h.cfg.Concurrency, h.cfg.Duration, 0, g, &h.seq, replay)
		h.logf("scale %d keys: round %d/%d %8.0f/s  p99 %s  errors %d", row.Keys, r+1, h.cfg.Rounds, round.rps(), fmtDuration(round.percentile(99)), round.errs)
		s.add(round)
	}
	row.Replay = resultOf(s)
	if row.RSSLoaded, err = g.rssBytes(); err != nil {
		return err
	}
	anon, _ := g.procStatus("RssAnon")
	file, _ := g.procStatus("RssFile")
	h.logf("scale %d keys: RSS after load %d MiB = %d MiB anonymous (heap, caches, memtables) + %d MiB file-backed (mapped store files)",
		row.Keys, row.RSSLoaded>>20, anon>>20, file>>20)
	if row.List, err = h.listLatency(ctx, g.base); err != nil {
		return err
	}
	row.Async = resultOf(h.submitAndAwait(ctx, g, h.cfg.Operations))
	h.logf("scale %d keys: %d operations end to end at %.0f/s", row.Keys, h.cfg.Operations, row.Async.RPS)
	return ctx.Err()
}

// listLatency is the median of five GET {operations}?status=queued&limit=1.
func (h *harness) listLatency(ctx context.Context, base string) (time.Duration, error) {
	var times []time.Duration
	for range 5 {
		t0 := time.Now()
		resp, body, err := send(ctx, h.client, http.MethodGet, base+operationsPath+"?status=queued&limit=1", nil)
		if err != nil {
			return 0, err
		}
		if err := expectStatus(resp, body, http.StatusOK); err != nil {
			return 0, err
		}
		times = append(times, time.Since(t0))
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

// dirSize is the total size of the files under dir.
func dirSize(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				total += info.Size()
			}
		}
		return nil
	})
	return total
}

// printScale writes the scale measurements as a Markdown table.
func printScale(w io.Writer, rows []ScaleRow) {
	if len(rows) == 0 {
		return
	}
	table := [][]string{{"keys", "operations", "seed time", "on disk", "RSS at start", "RSS after load", "replay req/s", "p50", "p99", "list ?status=queued", "async ops/s"}}
	for _, r := range rows {
		line := []string{fmt.Sprint(r.Keys), fmt.Sprint(r.Operations), r.Seed.Round(100 * time.Millisecond).String(),
			mib(r.DiskBytes), mib(r.RSSStart), mib(r.RSSLoaded)}
		line = append(line, resultCells(r.Replay)...)
		line = append(line, fmtDuration(r.List), asyncCell(r.Async))
		table = append(table, line)
	}
	writeMarkdown(w, table)
}

func mib(b int64) string { return fmt.Sprintf("%d MiB", b>>20) }

// asyncCell is the end-to-end operations rate, with the unfinished count if any.
func asyncCell(r *Result) string {
	if r == nil {
		return "–"
	}
	if r.Errors > 0 {
		return fmt.Sprintf("%.0f (%d not done)", r.RPS, r.Errors)
	}
	return fmt.Sprintf("%.0f", r.RPS)
}

package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// connEvery is how often the PostgreSQL gateways' connections are counted during the run: a
// psql process a second is light next to the load.
const connEvery = time.Second

// ConnRow is one PostgreSQL gateway's connections as pg_stat_activity lists them, told apart
// by the application_name the harness gives each gateway (sides.go).
type ConnRow struct {
	// Gateway names the gateway, such as postgres-2 (a replica) or webhooks.
	Gateway string
	// Peak is the most connections seen at once during the scenarios; End is the count when
	// they ended.
	Peak, End int
}

// connWatch counts the run's PostgreSQL connections every connEvery until stopped. It runs
// psql rather than a driver: only store/ imports PostgreSQL drivers.
type connWatch struct {
	h      *harness
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	peak   map[string]int
	err    error
	rows   []ConnRow
}

// watchConnections starts counting the run's PostgreSQL connections.
func (h *harness) watchConnections(ctx context.Context) *connWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &connWatch{h: h, cancel: cancel, done: make(chan struct{}), peak: map[string]int{}}
	go func() {
		defer close(w.done)
		t := time.NewTicker(connEvery)
		defer t.Stop()
		for {
			counts, err := w.count(ctx)
			w.mu.Lock()
			if err != nil && ctx.Err() == nil && w.err == nil {
				w.err = err
			}
			for name, n := range counts {
				w.peak[name] = max(w.peak[name], n)
			}
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// stop ends the counting and returns the rows: the peaks and a last count. Later calls
// return the same rows.
func (w *connWatch) stop(ctx context.Context) []ConnRow {
	w.once.Do(func() {
		w.cancel()
		<-w.done
		end, err := w.count(ctx)
		w.mu.Lock()
		defer w.mu.Unlock()
		if err != nil && w.err == nil {
			w.err = err
		}
		prefix := w.h.applicationName("")
		for name, peak := range w.peak {
			w.rows = append(w.rows, ConnRow{Gateway: strings.TrimPrefix(name, prefix), Peak: peak, End: end[name]})
		}
		slices.SortFunc(w.rows, func(a, b ConnRow) int { return strings.Compare(a.Gateway, b.Gateway) })
		if w.err != nil {
			w.h.logf("counting PostgreSQL connections: %v", w.err)
		}
	})
	return w.rows
}

// count is the run's connections per application_name now.
func (w *connWatch) count(ctx context.Context) (map[string]int, error) {
	query := fmt.Sprintf(`SELECT application_name, count(*) FROM pg_stat_activity
		WHERE application_name LIKE '%s%%' GROUP BY 1`, w.h.applicationName(""))
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "psql", "-X", "-q", "-A", "-t", "-F", "\t", "-d", w.h.cfg.Postgres, "-c", query).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("psql: %v: %s", err, strings.TrimSpace(string(out)))
	}
	counts := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, n, ok := strings.Cut(line, "\t")
		if !ok {
			continue
		}
		if v, err := strconv.Atoi(n); err == nil {
			counts[name] = v
		}
	}
	return counts, nil
}

// printConnections writes the connections table, or why there is none.
func printConnections(w io.Writer, rows []ConnRow) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "PostgreSQL connections: none counted (is psql on PATH? see stderr)")
		fmt.Fprintln(w)
		return
	}
	table := [][]string{{"PostgreSQL gateway", "peak connections", "at the end"}}
	total := ConnRow{Gateway: "total"}
	for _, r := range rows {
		table = append(table, []string{r.Gateway, fmt.Sprint(r.Peak), fmt.Sprint(r.End)})
		total.Peak += r.Peak
		total.End += r.End
	}
	if len(rows) > 1 {
		table = append(table, []string{total.Gateway, fmt.Sprint(total.Peak) + " (sum of peaks)", fmt.Sprint(total.End)})
	}
	writeMarkdown(w, table)
}

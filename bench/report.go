package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// printTable writes the rows as an aligned Markdown table: plain Caddy, then each Mulligan
// side with its rate over plain Caddy's.
func printTable(w io.Writer, sides []string, rows []Row) {
	if len(rows) == 0 {
		return
	}
	header := []string{"scenario", "plain req/s", "p50", "p99"}
	for _, side := range sides {
		header = append(header, side+" req/s", "p50", "p99", "ratio")
	}
	table := [][]string{append(header, "notes")}
	for _, r := range rows {
		line := []string{r.Scenario}
		line = append(line, resultCells(r.Plain)...)
		for i := range sides {
			res := sideResult(r, i)
			line = append(line, resultCells(res)...)
			line = append(line, ratio(r.Plain, res))
		}
		line = append(line, notes(sides, r))
		table = append(table, line)
	}
	writeMarkdown(w, table)
}

// sideResult is the row's result of side i, nil when not measured.
func sideResult(r Row, i int) *Result {
	if i < len(r.Mulligan) {
		return r.Mulligan[i]
	}
	return nil
}

// resultCells are the req/s, p50 and p99 cells of one result, dashes when there is none.
func resultCells(r *Result) []string {
	if r == nil {
		return []string{"–", "–", "–"}
	}
	return []string{fmt.Sprintf("%.0f", r.RPS), fmtDuration(r.P50), fmtDuration(r.P99)}
}

// ratio is a Mulligan side's req/s over plain Caddy's.
func ratio(plain, side *Result) string {
	if plain == nil || side == nil || plain.RPS == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", side.RPS/plain.RPS)
}

// notes joins the row's note with any unexpected answers.
func notes(sides []string, r Row) string {
	parts := []string{}
	if r.Note != "" {
		parts = append(parts, r.Note)
	}
	type named struct {
		name string
		res  *Result
	}
	all := []named{{"plain", r.Plain}}
	for i, side := range sides {
		all = append(all, named{side, sideResult(r, i)})
	}
	for _, side := range all {
		if side.res != nil && side.res.Errors > 0 {
			parts = append(parts, fmt.Sprintf("%s: %d unexpected answers of %d, first: %s",
				side.name, side.res.Errors, side.res.Errors+side.res.OK, truncate(side.res.FirstError, 160)))
		}
	}
	return strings.ReplaceAll(strings.Join(parts, "; "), "|", "/")
}

// writeMarkdown pads every column to its widest cell, the first row being the header.
func writeMarkdown(w io.Writer, table [][]string) {
	widths := make([]int, len(table[0]))
	for _, row := range table {
		for i, c := range row {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	for n, row := range table {
		fmt.Fprintln(w, markdownLine(row, widths, false))
		if n == 0 {
			fmt.Fprintln(w, markdownLine(row, widths, true))
		}
	}
	fmt.Fprintln(w)
}

func markdownLine(row []string, widths []int, rule bool) string {
	var b strings.Builder
	b.WriteString("|")
	for i, c := range row {
		if rule {
			c = strings.Repeat("-", widths[i])
		}
		fmt.Fprintf(&b, " %s%s |", c, strings.Repeat(" ", widths[i]-len([]rune(c))))
	}
	return b.String()
}

// fmtDuration prints a latency with three significant digits at most.
func fmtDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

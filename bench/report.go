package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// printTable writes the rows as an aligned Markdown table.
func printTable(w io.Writer, rows []Row) {
	if len(rows) == 0 {
		return
	}
	table := [][]string{{"scenario", "plain req/s", "p50", "p99", "mulligan req/s", "p50", "p99", "ratio", "notes"}}
	for _, r := range rows {
		line := []string{r.Scenario}
		line = append(line, resultCells(r.Plain)...)
		line = append(line, resultCells(r.Mulligan)...)
		line = append(line, ratio(r), notes(r))
		table = append(table, line)
	}
	writeMarkdown(w, table)
}

// resultCells are the req/s, p50 and p99 cells of one result, dashes when there is none.
func resultCells(r *Result) []string {
	if r == nil {
		return []string{"–", "–", "–"}
	}
	return []string{fmt.Sprintf("%.0f", r.RPS), fmtDuration(r.P50), fmtDuration(r.P99)}
}

// ratio is Mulligan's req/s over plain Caddy's.
func ratio(r Row) string {
	if r.Plain == nil || r.Mulligan == nil || r.Plain.RPS == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", r.Mulligan.RPS/r.Plain.RPS)
}

// notes joins the row's note with any unexpected answers.
func notes(r Row) string {
	parts := []string{}
	if r.Note != "" {
		parts = append(parts, r.Note)
	}
	for _, side := range []struct {
		name string
		res  *Result
	}{{"plain", r.Plain}, {"mulligan", r.Mulligan}} {
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

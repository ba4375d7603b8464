package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// logWriter sends the harness's progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestHarnessMeasuresEveryScenario runs the whole harness briefly (real binary, real model
// server, plain Caddy and Mulligan on Badger) and checks that every scenario measured something on both gateways.
// It asserts nothing about speed.
func TestHarnessMeasuresEveryScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the gateway binary")
	}
	cfg := DefaultConfig()
	cfg.Concurrency, cfg.Duration, cfg.Rounds = 4, 300*time.Millisecond, 1
	cfg.Scenarios = []string{ScenarioPassthrough, ScenarioNewKeys, ScenarioReplays, ScenarioAsync}
	cfg.ReplayKeys, cfg.Operations, cfg.AsyncOps = 50, 50, 500
	cfg.Progress = logWriter{t}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var out bytes.Buffer
	rep, err := Run(ctx, cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "machine: ") || !strings.Contains(out.String(), "| scenario") {
		t.Error("the output lacks the machine line or the table")
	}
	// passthrough, newkeys, replays, and async's accept, end-to-end and half-rate rows.
	if len(rep.Rows) != 6 {
		t.Fatalf("%d rows, want 6", len(rep.Rows))
	}
	for _, r := range rep.Rows {
		if len(r.Mulligan) != 1 {
			t.Fatalf("%s: %d Mulligan results, want 1 (Badger)", r.Scenario, len(r.Mulligan))
		}
		for side, res := range map[string]*Result{"plain": r.Plain, "badger": r.Mulligan[0]} {
			if res == nil || res.RPS <= 0 {
				t.Errorf("%s: no %s rate measured (%+v, note %q)", r.Scenario, side, res, r.Note)
			}
		}
	}
}

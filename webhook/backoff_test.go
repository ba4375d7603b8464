package webhook_test

import (
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/webhook"
)

func TestBackoffGrowsExponentiallyWithinBounds(t *testing.T) {
	const minWait, maxWait = 100 * time.Millisecond, 5 * time.Second
	for attempt := 0; attempt < 12; attempt++ {
		ceiling := min(minWait<<(attempt+1), maxWait)
		for range 200 {
			got := webhook.Backoff(minWait, maxWait, attempt, 0)
			if got < minWait || got > ceiling {
				t.Fatalf("Backoff(attempt %d) = %v, want within [%v, %v]", attempt, got, minWait, ceiling)
			}
		}
	}
}

func TestBackoffIsJittered(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 100 {
		seen[webhook.Backoff(time.Second, time.Minute, 3, 0)] = true
	}
	if len(seen) < 50 {
		t.Fatalf("100 waits took only %d distinct values; want full jitter", len(seen))
	}
}

func TestBackoffHonoursRetryAfter(t *testing.T) {
	tests := []struct {
		name       string
		retryAfter time.Duration
		want       time.Duration
	}{
		{"beyond the exponential window and max", 2 * time.Minute, 2 * time.Minute},
		{"capped at MaxRetryAfter", 48 * time.Hour, webhook.MaxRetryAfter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := webhook.Backoff(time.Second, 10*time.Second, 0, tt.retryAfter); got != tt.want {
				t.Fatalf("Backoff = %v, want %v", got, tt.want)
			}
		})
	}
	for range 100 {
		if got := webhook.Backoff(time.Second, time.Minute, 4, 3*time.Second); got < 3*time.Second {
			t.Fatalf("Backoff = %v, less than Retry-After 3s", got)
		}
	}
}

func TestBackoffSurvivesOddInputs(t *testing.T) {
	tests := []struct {
		name             string
		minWait, maxWait time.Duration
		attempt          int
		atMost           time.Duration
	}{
		{"huge attempt does not overflow", time.Second, time.Hour, 10_000, time.Hour},
		{"max below min uses min", time.Second, time.Millisecond, 3, time.Second},
		{"zero min still grows", 0, time.Second, 5, time.Second},
		{"all zero", 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := webhook.Backoff(tt.minWait, tt.maxWait, tt.attempt, 0); got < 0 || got > tt.atMost {
				t.Fatalf("Backoff = %v, want within [0, %v]", got, tt.atMost)
			}
		})
	}
}

// TestDefaultScheduleRidesOutADayLongOutage checks the outbox's default schedule: its eight
// attempts span more than a day even with the least jitter, and an hour-long outage leaves
// attempts to spare.
func TestDefaultScheduleRidesOutADayLongOutage(t *testing.T) {
	attempts := len(webhook.DefaultSchedule) + 1
	if attempts != 8 {
		t.Fatalf("the default schedule makes %d attempts, want 8", attempts)
	}
	var floor, ceiling time.Duration
	for retry := range attempts - 1 {
		lo := webhook.DefaultSchedule[retry]
		floor += lo
		for range 200 {
			w := webhook.ScheduledWait(webhook.DefaultSchedule, retry, 0)
			if w < lo || w > lo+lo/5 {
				t.Fatalf("retry %d waits %v, want %v to %v", retry, w, lo, lo+lo/5)
			}
			ceiling = max(ceiling, w)
		}
	}
	if want := 27*time.Hour + 35*time.Minute + 5*time.Second; floor != want {
		t.Fatalf("the schedule spans %v at least, want %v", floor, want)
	}
	if floor < 24*time.Hour {
		t.Fatalf("the schedule spans %v, under a day", floor)
	}
	// During a one-hour outage from the first attempt, the attempts made are those due within it.
	var at time.Duration
	used := 1
	for retry := 0; at+webhook.DefaultSchedule[retry] <= time.Hour; retry++ {
		at += webhook.DefaultSchedule[retry]
		used++
	}
	if used >= attempts {
		t.Fatalf("an hour-long outage uses all %d attempts", attempts)
	}
	t.Logf("default schedule: %d attempts over at least %v; an hour-long outage uses %d", attempts, floor, used)
}

func TestScheduledWaitRepeatsItsLastWaitAndHonoursRetryAfter(t *testing.T) {
	schedule := []time.Duration{time.Second, time.Minute}
	if w := webhook.ScheduledWait(schedule, 9, 0); w < time.Minute || w > 72*time.Second {
		t.Errorf("retry past the schedule waits %v, want its last wait, 1m to 1m12s", w)
	}
	if w := webhook.ScheduledWait(schedule, 0, 30*time.Second); w != 30*time.Second {
		t.Errorf("Retry-After 30s waits %v, want 30s", w)
	}
	if w := webhook.ScheduledWait(schedule, 0, 48*time.Hour); w != webhook.MaxRetryAfter {
		t.Errorf("Retry-After 48h waits %v, want MaxRetryAfter", w)
	}
}

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

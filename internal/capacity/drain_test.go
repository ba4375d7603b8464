package capacity

import (
	"testing"
	"time"
)

func TestDrainRateForgetsReleasesOlderThanAMinute(t *testing.T) {
	var d DrainRate
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10 { // a fast burst long ago: ten releases in a second
		d.Record(start.Add(time.Duration(i) * 100 * time.Millisecond))
	}
	now := start.Add(10 * time.Minute)
	d.Record(now.Add(-20 * time.Second)) // then two releases 10s apart, lately
	d.Record(now.Add(-10 * time.Second))
	if got := d.PerSecond(now); got != 0.1 {
		t.Fatalf("rate %v/s; want 0.1/s from the last minute's releases only", got)
	}
	if got := d.TimeFor(3, now); got != 30*time.Second {
		t.Fatalf("3 releases take %v; want 30s", got)
	}
	if got := d.TimeFor(1<<40, now); got != 5*time.Minute {
		t.Fatalf("a huge backlog takes %v; want the 5 minute ceiling", got)
	}
}

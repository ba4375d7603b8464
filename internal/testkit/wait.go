package testkit

import (
	"testing"
	"time"
)

// MinWait is the least WaitFor and Receive wait before the test fails. Their bound guards
// against a hang; it never times what they wait for (a test that bounds how soon something
// happens says so with its own assertion). The suite runs its packages side by side under -race,
// where what takes a second alone can take several: bounds of 5 s set beside what they waited
// for failed in CI on clean clones more than once.
const MinWait = 30 * time.Second

// WaitFor waits, bounded by within or MinWait when that is longer, until cond holds, asking
// every few milliseconds; the test fails naming what it waited for when it does not. It is for
// outcomes that come from another goroutine or process with no event to wait on (a row a replica
// writes, a port a child binds); what can be awaited on a channel is awaited there.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	within = max(within, MinWait)
	expired := time.NewTimer(within)
	defer expired.Stop()
	every := 2 * time.Millisecond
	for !cond() {
		select {
		case <-expired.C:
			t.Fatalf("not within %v: %s", within, what)
		case <-time.After(every):
		}
		every = min(2*every, 50*time.Millisecond) // quick for the common fast case, light for slow ones
	}
}

// Receive waits, bounded by MinWait, for what ch brings; the test fails naming what it waited
// for when nothing comes.
func Receive[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(MinWait):
		t.Fatalf("not within %v: %s", MinWait, what)
		panic("unreachable")
	}
}

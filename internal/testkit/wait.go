package testkit

import (
	"testing"
	"time"
)

// WaitFor waits, bounded by within, until cond holds, asking every few milliseconds; the test
// fails naming what it waited for when it does not. It is for outcomes that come from another
// goroutine or process with no event to wait on (a row a replica writes, a port a child binds);
// what can be awaited on a channel is awaited there.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
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

// Receive waits, bounded by 10 s, for what ch brings; the test fails naming what it waited for
// when nothing comes.
func Receive[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("not within 10s: %s", what)
		panic("unreachable")
	}
}

// Package storetest is the behaviour suite every storage backend passes: claims, fencing,
// replays, transitions, the queue, the outbox, listing and expiry, as store.Backend promises
// them (see docs/backends.md). A backend is done when Run passes against it.
package storetest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// Storage opens handles on one fresh storage, each with now as its clock. Handles opened by one
// Storage share the data: two of them act as two replicas (PostgreSQL) or two configurations on
// one directory (Badger). Each handle is closed when the test ends.
type Storage func(now func() time.Time) store.Backend

// Run runs the suite; fresh returns a new, empty storage for each test.
func Run(t *testing.T, fresh func(t *testing.T) Storage) {
	for _, tc := range slices.Concat(keyTests, operationTests, queueTests, capacityTests, outboxTests, inputTests, streamTests, streamFenceTests, operationStreamTests, admissionTests, batchTests) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, &env{storage: fresh(t), clock: NewClock()})
		})
	}
}

type test struct {
	name string
	fn   func(t *testing.T, e *env)
}

// env is one test's storage and clock.
type env struct {
	storage Storage
	clock   *Clock
}

// open returns a new handle on the test's storage, on the test's clock.
func (e *env) open() store.Backend { return e.storage(e.clock.Now) }

// Clock is a clock that moves only when told to: the suite's, and any backend test's that
// needs to move time on (retention, leases).
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock is a Clock at the present, to the millisecond (as both backends store times).
func NewClock() *Clock { return &Clock{now: time.Now().UTC().Truncate(time.Millisecond)} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// opID is the i-th operation id of a test: ids sort by creation, as the gateway's do.
func opID(i int) string { return fmt.Sprintf("op_%06d", i) }

// newOp is a queued operation of scope, submitted now.
func (e *env) newOp(i int, scope string) *store.Operation {
	return &store.Operation{
		ID: opID(i), Scope: scope, Status: store.StatusQueued, Version: 1, Method: "POST", Path: "/v1/x",
		SubmittedAt: e.clock.Now(), Retention: time.Hour, Urgency: store.DefaultUrgency, // the zero value is the most urgent
	}
}

// accept stores operations 0..n-1 of scope, queued, failing the test on error.
func (e *env) accept(t *testing.T, b store.Backend, scope string, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if _, err := b.AcceptOperation(e.newOp(i, scope), &store.Request{Method: "POST", URL: "/v1/x"}, nil); err != nil {
			t.Fatalf("accept %s: %v", opID(i), err)
		}
	}
}

func ids(ops []*store.Operation) []string {
	out := []string{}
	for _, o := range ops {
		out = append(out, o.ID)
	}
	return out
}

// must returns a call's result, failing the test on its error: must(b.GetOperation(id))(t).
func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pair is must for calls with two results: pair(b.QueueStats())(t).
func pair[A, B any](a A, b B, err error) func(t *testing.T) (A, B) {
	return func(t *testing.T) (A, B) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}
}

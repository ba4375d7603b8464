package runner

import (
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/internal/courier"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// gatedClaims is a storage whose first claim that finds nothing waits for release before it
// answers: a claim that looked before work came, and has not ended when the work's wake-up
// arrives.
type gatedClaims struct {
	store.Backend
	once    sync.Once
	looked  chan struct{} // closed when that claim found nothing
	release chan struct{}
}

func (g *gatedClaims) ClaimNext(worker string, lease time.Duration) (*store.Operation, error) {
	op, err := g.Backend.ClaimNext(worker, lease)
	if op == nil && err == nil {
		first := false
		g.once.Do(func() { first = true; close(g.looked) })
		if first {
			<-g.release
		}
	}
	return op, err
}

// Work queued while the only slot's claim is looking, after it looked: the wake-up finds the
// slot busy claiming, and the claim ends empty-handed. It looks again at once, not at the next
// poll (a second away; never, on this clock, which stands still): the wake-up was lost, and
// TestRestartTakesOverTheDeadProcesssOperationsAtOnce failed under load when the takeover's
// requeue came during the first claim.
func TestWorkQueuedWhileAClaimLooksIsClaimedWithoutWaitingForThePoll(t *testing.T) {
	clock := newFakeClock()
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedClaims{Backend: st, looked: make(chan struct{}), release: make(chan struct{})}
	deliveries := courier.New(courier.Options{Store: st, Worker: "wrk_courier", Clock: clock, Log: zap.NewNop()})
	ran := make(chan struct{}, 1)
	r := New(Options{Store: g, Clock: clock, Log: zap.NewNop(), Courier: deliveries, Config: Config{Concurrency: 1}})
	r.Configure(testConfigOwner, Config{Concurrency: 1, Dispatch: func(*store.Operation) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			ran <- struct{}{}
			_, _ = w.Write([]byte(`{"ok":true}`))
		})
	}})
	t.Cleanup(func() {
		r.Stop()
		deliveries.Stop()
		_ = st.Close()
	})
	r.Start()
	select {
	case <-g.looked:
	case <-time.After(10 * time.Second):
		t.Fatal("not within 10s: no first claim")
	}
	// The loop idle, the claim in flight: the settings' own wake-up taken, no other claim starting.
	idle := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.claiming == 1 && len(r.wake) == 0
	}
	testkit.WaitFor(t, 10*time.Second, "the claim in flight, the loop idle", idle)
	ex := testExecution(time.Minute, 0)
	testkit.QueueChat(t, st, &store.Operation{ID: "op_1", Exec: &ex}, clock.Now(), nil, chat("late"))
	r.Accepted()
	testkit.WaitFor(t, 10*time.Second, "the loop to find every slot claiming", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.lookAgain
	})
	close(g.release)
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("not within 10s: the operation queued during a claim waited for the next poll")
	}
}

// countingClaims is a storage that counts its claims.
type countingClaims struct {
	store.Backend
	n atomic.Int64
}

func (c *countingClaims) ClaimNext(worker string, lease time.Duration) (*store.Operation, error) {
	c.n.Add(1)
	return c.Backend.ClaimNext(worker, lease)
}

// onePool is the capacity of a storage with one block.
type onePool struct{ p *capacity.Seats }

func (o onePool) Pools() []*capacity.Seats       { return []*capacity.Seats{o.p} }
func (o onePool) PoolFor(string) *capacity.Seats { return o.p }
func (o onePool) Upstream(_ *store.Operation, req *store.Request) *store.Request {
	return req
}

// capacityRunner is a runner of four slots on storage via (st underneath, closed at the end),
// with one capacity block of two seats whose freed seats kick it, as the gateway wires them, and
// shared seats from shared (nil: none).
func capacityRunner(t *testing.T, via store.Backend, st *badger.Store, clock clockwork.Clock, shared func() *capacity.Shared) *Runner {
	deliveries := courier.New(courier.Options{Store: st, Worker: "wrk_courier", Clock: clock, Log: zap.NewNop()})
	var r *Runner
	seats := capacity.NewSeats(capacity.Config{Limit: 2}, capacity.SeatsOptions{Clock: clock, OnFree: func() { r.Kick() }, Shared: shared})
	r = New(Options{Store: via, Clock: clock, Log: zap.NewNop(), Courier: deliveries, Seats: onePool{seats}, Config: Config{Concurrency: 4}})
	r.Configure(testConfigOwner, Config{Concurrency: 4, Dispatch: func(*store.Operation) http.Handler { return answerOK }})
	t.Cleanup(func() {
		r.Stop()
		deliveries.Stop()
		_ = st.Close()
	})
	return r
}

// With a capacity block and nothing queued, the claim loop rests: a claim takes a free seat, finds
// the queue empty and gives the seat back without telling the claimers a seat came free. Told,
// the claim that gave it back woke the loop for another, which did the same, without end (two
// gateways of the flood benchmark each spun a core after their flood).
func TestAnIdleRunnerUnderCapacityDoesNotClaimWithoutEnd(t *testing.T) {
	clock := newFakeClock()
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	c := &countingClaims{Backend: st}
	r := capacityRunner(t, c, st, clock, nil)
	r.Start()
	time.Sleep(300 * time.Millisecond) // on the real clock: the test's never polls
	if n := c.n.Load(); n > 5 {
		t.Fatalf("%d claims of an empty queue in 300 ms, nothing queued or freed meanwhile", n)
	}
}

// failingShared is shared seats whose storage answers reads but fails to take a seat (a disk
// full, a read-only primary, a lock timeout).
type failingShared struct{ n atomic.Int64 }

func (f *failingShared) AcquireSeat(string, string, string, int, time.Duration, store.SeatWaiter) (bool, error) {
	f.n.Add(1)
	return false, errors.New("could not extend file: No space left on device")
}
func (f *failingShared) WithdrawWaiter(string, string) error { return nil }
func (f *failingShared) ReleaseSeat(string, string) error    { return nil }
func (f *failingShared) RenewSeats(string, string, []string, time.Duration) ([]string, error) {
	return nil, nil
}
func (f *failingShared) SeatsHeld(string) (int, error) { return 0, nil }

// countingLooks is a storage that counts the looks at the queue's head.
type countingLooks struct {
	store.Backend
	n atomic.Int64
}

func (c *countingLooks) NextQueued() (*store.Operation, error) {
	c.n.Add(1)
	return c.Backend.NextQueued()
}

// A queued operation whose shared seat cannot be taken (the storage fails the take) waits for
// the next poll, not for the next claim at once: the local seat its claim gave back told the
// claimers a seat came free, and the claim's end kicked the loop, each claim failing the same
// way (15,761 looks in 300 ms, a warning logged for each).
func TestAClaimWhoseSharedSeatFailsIsNotRetriedWithoutEnd(t *testing.T) {
	clock := newFakeClock()
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	c := &countingLooks{Backend: st}
	fs := &failingShared{}
	shared := capacity.NewShared(fs, capacity.SharedOptions{Name: "model", Worker: "w", Limit: 2, Lease: time.Minute,
		Margin: time.Second, Renew: 10 * time.Second, Clock: clock, Log: zap.NewNop(), NewID: func(time.Time) string { return "seat_x" }})
	r := capacityRunner(t, c, st, clock, func() *capacity.Shared { return shared })
	ex := testExecution(time.Minute, 0)
	testkit.QueueChat(t, st, &store.Operation{ID: "op_1", Exec: &ex}, clock.Now(), nil, chat("x"))
	r.Start()
	time.Sleep(300 * time.Millisecond) // on the real clock: the test's never polls
	if n := c.n.Load(); n > 5 {
		t.Fatalf("%d looks at the queue in 300 ms while shared seats fail (%d takes)", n, fs.n.Load())
	}
}

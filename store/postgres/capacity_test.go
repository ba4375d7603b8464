package postgres

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

// replicas opens n handles on one fresh database, on clock.
func replicas(t *testing.T, n int, clock *storetest.Clock) []*Store {
	dsn := pgtest.Database(t)
	var out []*Store
	for range n {
		out = append(out, openTest(t, dsn, Options{Now: clock.Now, MaxConns: 8}))
	}
	return out
}

// warm opens n connections in each replica's pool, so that a race starts without connecting.
func warm(t *testing.T, reps []*Store, n int) {
	var wg sync.WaitGroup
	for _, r := range reps {
		conns := make(chan func(), n)
		for range n {
			wg.Go(func() {
				c, err := r.pool.Acquire(context.Background())
				if err != nil {
					t.Error(err)
					conns <- func() {}
					return
				}
				conns <- c.Release
			})
		}
		wg.Wait()
		close(conns)
		for release := range conns {
			release()
		}
	}
}

// Three replicas race 24 claimers for 5 shared seats: exactly 5 win, and a released seat is
// taken again at once.
func TestSharedSeatsHoldAcrossReplicas(t *testing.T) {
	clock := storetest.NewClock()
	reps := replicas(t, 3, clock)
	warm(t, reps, 8)
	const lease = 30 * time.Second
	var won atomic.Int32
	var winners sync.Map
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 24 {
		wg.Go(func() {
			<-start // all at once, so that counting and taking overlap
			seat := fmt.Sprintf("seat%d", i)
			ok, err := reps[i%3].AcquireSeat("model", seat, fmt.Sprintf("r%d", i%3), 5, lease, store.SeatWaiter{})
			if err != nil {
				t.Error(err)
			}
			if ok {
				won.Add(1)
				winners.Store(seat, i%3)
			}
		})
	}
	close(start)
	wg.Wait()
	for i, r := range reps { // the losers stand in the fleet's line until they give up
		if err := r.WithdrawWaiter("model", fmt.Sprintf("r%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if won.Load() != 5 || count(t, reps[0], `SELECT count(*) FROM seats`) != 5 {
		t.Fatalf("%d seats won, %d rows; want 5 of 5", won.Load(), count(t, reps[0], `SELECT count(*) FROM seats`))
	}
	if ok, err := reps[1].AcquireSeat("model", "late", "r1", 5, lease, store.SeatWaiter{}); ok || err != nil {
		t.Fatalf("a sixth seat: %v %v", ok, err)
	}
	if ok, err := reps[1].AcquireSeat("other", "late", "r1", 5, lease, store.SeatWaiter{}); !ok || err != nil {
		t.Fatalf("a seat of another pool: %v %v", ok, err)
	}
	var held string
	winners.Range(func(k, _ any) bool { held = k.(string); return false })
	if ok, err := reps[2].AcquireSeat("model", held, "r2", 5, lease, store.SeatWaiter{}); !ok || err != nil {
		t.Fatalf("taking a held seat again (a renewal): %v %v", ok, err)
	}
	if err := reps[2].ReleaseSeat("model", held); err != nil {
		t.Fatal(err)
	}
	if ok, err := reps[1].AcquireSeat("model", "late", "r1", 5, lease, store.SeatWaiter{}); !ok || err != nil {
		t.Fatalf("after a release: %v %v", ok, err)
	}
}

// seatLease is the lease of a seat that a test lets lapse: seats lapse on the database's clock,
// so such a test waits for it in real time.
const seatLease = time.Second

// afterLease waits until the seats taken before it with seatLease have lapsed on the database's
// clock: a lease begins when the statement that takes the seat runs.
func afterLease() { time.Sleep(seatLease + 100*time.Millisecond) }

// acquireSeat has st take seat of pool "model" (of limit) for worker, failing the test unless
// the answer is want.
func acquireSeat(t *testing.T, st *Store, seat, worker string, limit int, lease time.Duration, want bool) {
	t.Helper()
	if ok, err := st.AcquireSeat("model", seat, worker, limit, lease, store.SeatWaiter{}); ok != want || err != nil {
		t.Fatalf("%s takes %s: %v %v, want %v", worker, seat, ok, err, want)
	}
}

// A replica that stops renewing loses its seats once they lapse; the live replica's renewed
// seats hold, and a late renewal does not revive the lapsed ones.
func TestDeadReplicasSeatsLapse(t *testing.T) {
	clock := storetest.NewClock()
	reps := replicas(t, 2, clock)
	dead, live := reps[0], reps[1]
	for _, seat := range []string{"d1", "d2", "d3"} {
		acquireSeat(t, dead, seat, "dead", 4, seatLease, true)
	}
	acquireSeat(t, live, "l1", "live", 4, seatLease, true)
	acquireSeat(t, live, "l2", "live", 4, seatLease, false)
	if renewed, err := live.RenewSeats("model", "live", []string{"l1"}, time.Minute); err != nil || !slices.Equal(renewed, []string{"l1"}) {
		t.Fatalf("renewing l1: %v %v", renewed, err)
	}
	afterLease() // dead's seats lapsed; live's renewed one holds for a minute
	for _, seat := range []string{"l2", "l3", "l4"} {
		acquireSeat(t, live, seat, "live", 4, time.Minute, true)
	}
	acquireSeat(t, live, "l5", "live", 4, time.Minute, false)
	if renewed, err := dead.RenewSeats("model", "dead", []string{"d1", "d2", "d3"}, time.Minute); err != nil || len(renewed) != 0 {
		t.Fatalf("a late renewal: renewed %v %v, want none", renewed, err)
	}
	if n := count(t, live, `SELECT count(*) FROM seats WHERE worker = 'dead'`); n != 0 {
		t.Fatalf("the dead replica holds %d seats after its late renewal", n)
	}
}

// A seat whose release was lost (the database blipped, or the answer to its taking never came)
// is held by no call: the worker goes on renewing the seats its calls hold, and the lost one
// lapses after its lease and goes to another replica. Renewing it by name after it lapsed does
// not revive it, and RenewSeats says so.
func TestSeatWhoseReleaseWasLostLapsesWhileItsWorkerRenewsTheOthers(t *testing.T) {
	clock := storetest.NewClock()
	reps := replicas(t, 2, clock)
	a, b := reps[0], reps[1]
	for _, seat := range []string{"held", "lost"} {
		acquireSeat(t, a, seat, "a", 2, seatLease, true)
	}
	// "lost" is never released; a renews what its calls hold.
	if renewed, err := a.RenewSeats("model", "a", []string{"held"}, time.Minute); err != nil || !slices.Equal(renewed, []string{"held"}) {
		t.Fatalf("renewing the held seat: %v %v", renewed, err)
	}
	afterLease()
	acquireSeat(t, b, "b1", "b", 2, time.Minute, true) // the lost seat's place
	acquireSeat(t, b, "b2", "b", 2, time.Minute, false)
	renewed, err := a.RenewSeats("model", "a", []string{"held", "lost"}, time.Minute)
	if err != nil || !slices.Equal(renewed, []string{"held"}) {
		t.Fatalf("renewing both: renewed %v %v; want only the held seat", renewed, err)
	}
	if n := count(t, a, `SELECT count(*) FROM seats WHERE worker = 'a'`); n != 1 {
		t.Fatalf("a holds %d seats, want 1", n)
	}
}

// Seats are leased on the database's clock: a replica whose clock runs ten minutes ahead does
// not take a seat a live replica holds, nor count it lapsed; one whose clock runs ten minutes
// behind does not keep a seat past its lease, and its late renewal does not revive it.
func TestReplicaWithASkewedClockNeitherStealsNorKeepsASeat(t *testing.T) {
	dsn := pgtest.Database(t)
	ahead, behind := storetest.NewClock(), storetest.NewClock()
	ahead.Advance(10 * time.Minute)
	behind.Advance(-10 * time.Minute)
	live := openTest(t, dsn, Options{Now: storetest.NewClock().Now})
	fast := openTest(t, dsn, Options{Now: ahead.Now})
	slow := openTest(t, dsn, Options{Now: behind.Now})

	acquireSeat(t, live, "live", "live", 1, time.Minute, true)
	acquireSeat(t, fast, "fast", "fast", 1, time.Minute, false)
	if err := fast.WithdrawWaiter("model", "fast"); err != nil { // it gives up
		t.Fatal(err)
	}
	if n, err := fast.SeatsHeld("model"); n != 1 || err != nil {
		t.Fatalf("seats held, as the replica ahead reads them: %d %v; want the live one", n, err)
	}
	if err := live.ReleaseSeat("model", "live"); err != nil {
		t.Fatal(err)
	}

	acquireSeat(t, slow, "slow", "slow", 1, seatLease, true)
	acquireSeat(t, live, "live", "live", 1, time.Minute, false)
	afterLease()
	if n, err := slow.SeatsHeld("model"); n != 0 || err != nil {
		t.Fatalf("seats held past their lease, as the replica behind reads them: %d %v; want none", n, err)
	}
	acquireSeat(t, live, "live", "live", 1, time.Minute, true)
	if renewed, err := slow.RenewSeats("model", "slow", []string{"slow"}, time.Minute); err != nil || len(renewed) != 0 {
		t.Fatalf("the replica behind renewing its lapsed seat: %v %v; want none renewed", renewed, err)
	}
}

// An operation written by a replica that predates urgencies (no urgency column, no urgency in its
// document) waits at urgency 3: between u=0 and u=7 work.
func TestOperationOfAnOlderReplicaWaitsAtTheDefaultUrgency(t *testing.T) {
	clock := storetest.NewClock()
	st := replicas(t, 1, clock)[0]
	for i, u := range []int{store.LeastUrgent, store.MostUrgent} {
		op := &store.Operation{ID: fmt.Sprintf("op_%d", i), Scope: "s", Status: store.StatusQueued, Version: 1, Urgency: u,
			SubmittedAt: clock.Now(), Retention: time.Hour}
		if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	doc := fmt.Sprintf(`{"id":"op_2","scope":"s","status":"queued","version":1,"submitted_at":%q,"retention":3600000000000}`,
		clock.Now().Format(time.RFC3339Nano))
	if _, err := st.pool.Exec(context.Background(), `INSERT INTO operations (id, scope, status, doc) VALUES ('op_2', 's', 'queued', $1)`,
		[]byte(doc)); err != nil {
		t.Fatal(err)
	}
	if op, err := st.GetOperation("op_2"); err != nil || op.Urgency != store.DefaultUrgency {
		t.Fatalf("older replica's operation: %+v %v", op, err)
	}
	var got []string
	for range 3 {
		op, err := st.ClaimNext("w", time.Minute)
		if err != nil || op == nil {
			t.Fatalf("claim: %v %v", op, err)
		}
		got = append(got, op.ID)
	}
	if want := []string{"op_1", "op_2", "op_0"}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
}

// The sweep forgets the turn of a scope left without work store.KeepIdleLanesFor after it first
// finds it so, keeps one with work running and the newcomers' turns (which no operation's lane
// is), and deletes lapsed seats.
func TestSweepForgetsIdleTurnsAndLapsedSeats(t *testing.T) {
	clock := storetest.NewClock()
	st := replicas(t, 1, clock)[0]
	for i, scope := range []string{"idle", "busy"} {
		op := &store.Operation{ID: fmt.Sprintf("op_%d", i), Scope: scope, Status: store.StatusQueued, Version: 1,
			SubmittedAt: clock.Now(), Retention: time.Hour}
		if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := st.ClaimNext("w", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Transition("op_0", store.Change{To: store.StatusSucceeded, Holder: "w"}); err != nil {
		t.Fatal(err)
	}
	acquireSeat(t, st, "s1", "w", 1, seatLease, true)
	afterLease()
	stats, err := st.Sweep()
	if err != nil || stats.Turns != 0 || stats.Seats != 1 {
		t.Fatalf("sweep: %+v %v, want no turn (the idle scope's is kept a while) and 1 seat", stats, err)
	}
	clock.Advance(store.KeepIdleLanesFor + time.Second)
	stats, err = st.Sweep()
	if err != nil || stats.Turns != 1 {
		t.Fatalf("sweep past store.KeepIdleLanesFor: %+v %v, want 1 turn", stats, err)
	}
	if n := count(t, st, `SELECT count(*) FROM queue_lanes WHERE lane = 'busy'`); n != 1 {
		t.Fatalf("the busy scope's turn was forgotten")
	}
	if n := count(t, st, `SELECT count(*) FROM queue_lanes WHERE lane LIKE '`+newcomersLane+`%'`); n != 25 {
		t.Fatalf("the newcomers' turns or the virtual time were forgotten")
	}
	// The busy scope's operation ran longer than store.KeepIdleLanesFor: its turn is that old
	// when it ends, and is kept as long again from then. Counted from the turn, it was forgotten
	// at the first sweep.
	if _, err := st.Transition("op_1", store.Change{To: store.StatusSucceeded, Holder: "w"}); err != nil {
		t.Fatal(err)
	}
	if stats, err := st.Sweep(); err != nil || stats.Turns != 0 {
		t.Fatalf("sweep after a long operation ended: %+v %v, want its scope's turn kept", stats, err)
	}
	clock.Advance(store.KeepIdleLanesFor + time.Second)
	if stats, err := st.Sweep(); err != nil || stats.Turns != 1 {
		t.Fatalf("sweep %s after it ended: %+v %v, want its turn forgotten", store.KeepIdleLanesFor, stats, err)
	}
}

// acceptNew queues operation id of scope, submitted at at.
func acceptNew(t *testing.T, st *Store, id, scope string, at time.Time) {
	t.Helper()
	op := &store.Operation{ID: id, Scope: scope, Status: store.StatusQueued, Version: 1,
		SubmittedAt: at, Retention: time.Hour, Urgency: store.DefaultUrgency}
	if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
		t.Fatal(err)
	}
}

// Two replicas claim operations of new lanes at once: a claim of a newcomer never waits for
// another one's transaction, by either path (ClaimNext, ClaimQueued). When a claim inserted the
// newcomers' row (ON CONFLICT DO NOTHING), it waited for whichever claim had last moved it on,
// until that one committed.
func TestNewcomersClaimsDoNotWaitForOneAnother(t *testing.T) {
	for _, byID := range []bool{false, true} {
		t.Run(map[bool]string{false: "ClaimNext", true: "ClaimQueued"}[byID], func(t *testing.T) {
			clock := storetest.NewClock()
			reps := replicas(t, 2, clock)
			acceptNew(t, reps[0], "op_a0", "n0", clock.Now())
			if op, err := reps[0].ClaimNext("w", time.Minute); err != nil || op == nil {
				t.Fatal(op, err)
			}
			clock.Advance(time.Millisecond)
			acceptNew(t, reps[0], "op_a1", "n1", clock.Now())
			acceptNew(t, reps[0], "op_a2", "n2", clock.Now())
			clock.Advance(time.Millisecond)
			ctx := context.Background()
			tx, err := reps[0].pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			now := clock.Now()
			var id string
			var doc []byte
			var holder *string
			var lease *time.Time
			var c claimCharge
			if err := tx.QueryRow(ctx, claimSQL, now, agingStep, []string{}, now.UnixMicro()).Scan(&id, &doc, &holder, &lease, &c.charged, &c.band, &c.newcomer, &c.ncCharged); err != nil || doc == nil {
				t.Fatal(id, err)
			}
			other := map[string]string{"op_a1": "op_a2", "op_a2": "op_a1"}[id]
			done := make(chan error, 1)
			go func() {
				var err error
				if byID {
					_, err = reps[1].ClaimQueued(other, "w2", time.Minute)
				} else {
					_, err = reps[1].ClaimNext("w2", time.Minute)
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second): // a claim takes milliseconds; one that waits, until the commit below
				_ = tx.Commit(ctx)
				<-done
				t.Fatal("the other replica's claim of a newcomer waited for this one's transaction")
			}
		})
	}
}

// A ClaimNext and a ClaimQueued of two operations of one new lane at once, on two replicas, many
// times: the two paths take the lane's row and the newcomers' in orders that deadlocked while a
// claim could wait for the newcomers' row.
func TestNewcomersClaimsDoNotDeadlock(t *testing.T) {
	dsn := pgtest.Database(t)
	reps := []*Store{openTest(t, dsn, Options{}), openTest(t, dsn, Options{})}
	for i := range 100 {
		now := time.Now()
		lane := fmt.Sprintf("lane%04d", i)
		acceptNew(t, reps[0], fmt.Sprintf("op_%04d_a", i), lane, now)
		acceptNew(t, reps[0], fmt.Sprintf("op_%04d_b", i), lane, now)
		var wg sync.WaitGroup
		var errs [2]error
		wg.Go(func() { _, errs[0] = reps[0].ClaimNext("w1", time.Minute) })
		wg.Go(func() { _, errs[1] = reps[1].ClaimQueued(fmt.Sprintf("op_%04d_b", i), "w2", time.Minute) })
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
		for {
			if op, err := reps[0].ClaimNext("w1", time.Minute); err != nil || op == nil {
				break
			}
		}
	}
}

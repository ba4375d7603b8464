package capacity

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/store"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// granted reports whether w holds a seat, without waiting.
func granted(w *Waiter) bool {
	select {
	case <-w.ready:
		return true
	default:
		return false
	}
}

// order fills a one-seat pool with asks behind a held seat and returns the scopes (with their
// index) in the order the seats go to them, one release at a time.
func order(t *testing.T, clock *clockwork.FakeClock, asks []Ask) []int {
	t.Helper()
	p := NewPool(clock, Config{Limit: 1})
	holder := p.Enqueue(Ask{Scope: "holder", Since: clock.Now()})
	if !granted(holder) {
		t.Fatal("the first ask of an empty pool waits")
	}
	ws := make([]*Waiter, len(asks))
	for i, a := range asks {
		ws[i] = p.Enqueue(a)
	}
	var got []int
	for range asks {
		p.Release(nil, clock.Now(), Sample{Status: 200})
		for i, w := range ws {
			if granted(w) && !contains(got, i) {
				got = append(got, i)
			}
		}
	}
	return got
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPoolServesTheMostUrgentThenScopesInTurnThenTheOldest(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	asks := []Ask{
		{Urgency: 3, Scope: "a", Since: t0.Add(1)},
		{Urgency: 3, Scope: "a", Since: t0.Add(2)},
		{Urgency: 3, Scope: "b", Since: t0.Add(3)},
		{Urgency: 1, Scope: "c", Since: t0.Add(4), Trusted: true},
		{Urgency: 7, Scope: "d", Since: t0.Add(5)},
	}
	// c is the most urgent (an operator's class: trusted); then a and b alternate (a's oldest
	// first), then a's second, then the background work.
	if got, want := order(t, clock, asks), []int{3, 0, 2, 1, 4}; !equal(got, want) {
		t.Fatalf("seats went to %v; want %v", got, want)
	}
}

func TestPoolAgingRaisesBackgroundWorkUpToTheDefault(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0.Add(4 * store.AgingStep))
	asks := []Ask{
		{Urgency: 3, Scope: "fresh", Since: clock.Now()},
		{Urgency: 7, Scope: "old", Since: t0},                                  // four steps waited: effectively 3, and older
		{Urgency: 6, Scope: "young", Since: clock.Now().Add(-store.AgingStep)}, // one step: effectively 5
		{Urgency: 1, Scope: "urgent", Since: clock.Now(), Trusted: true},
	}
	if got, want := order(t, clock, asks), []int{3, 1, 0, 2}; !equal(got, want) {
		t.Fatalf("seats went to %v; want %v", got, want)
	}
}

func TestPoolWaitEndsAtItsDeadlineOnTheClock(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	if _, err := p.Await(context.Background(), p.Enqueue(Ask{Scope: "a", Since: t0}), time.Second); err != nil {
		t.Fatal(err)
	}
	w := p.Enqueue(Ask{Scope: "b", Since: t0})
	done := make(chan error, 1)
	go func() {
		_, err := p.Await(context.Background(), w, 5*time.Second)
		done <- err
	}()
	if err := clock.BlockUntilContext(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(5 * time.Second)
	if err := <-done; !errors.Is(err, ErrNoSeat) {
		t.Fatalf("after its wait: %v; want ErrNoSeat", err)
	}
	if s := p.Snapshot(); s.InUse != 1 || s.Waiting != [8]int{} || p.Remembered() != 0 {
		t.Fatalf("after the wait ended: %+v, %d scopes remembered; want one seat in use and nobody waiting", s, p.Remembered())
	}
}

func TestPoolAbandonedGrantFreesItsSeatForTheNext(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	first := p.Enqueue(Ask{Scope: "a", Since: t0})
	second := p.Enqueue(Ask{Scope: "b", Since: t0})
	if !granted(first) || granted(second) {
		t.Fatal("want the first granted, the second waiting")
	}
	p.Abandon(first) // granted, never taken
	if !granted(second) {
		t.Fatal("the seat of an abandoned grant did not go to the next waiter")
	}
	if _, err := p.Await(context.Background(), second, time.Second); err != nil {
		t.Fatal(err)
	}
	p.Abandon(second) // taken: abandoning it changes nothing
	if s := p.Snapshot(); s.InUse != 1 {
		t.Fatalf("%d seats in use; want the taken one", s.InUse)
	}
}

func TestPoolConfigureKeepsSeatsInUseAndGrantsNewRoom(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	p.Enqueue(Ask{Scope: "a", Since: t0})
	w := p.Enqueue(Ask{Scope: "b", Since: t0})
	p.Configure(Config{Limit: 2})
	if !granted(w) {
		t.Fatal("a larger limit did not grant the waiter")
	}
	p.Configure(Config{Auto: true, Min: 1, Max: 8})
	if s := p.Snapshot(); !s.Auto || s.InUse != 2 || s.Limit != 1 {
		t.Fatalf("after switching to auto: %+v; want auto, 2 in use, limit at its min 1", s)
	}
}

// fill enqueues asks in a one-seat pool behind a held seat and returns the pool and waiters.
func fill(t *testing.T, clock *clockwork.FakeClock, asks []Ask) (*Pool, []*Waiter) {
	t.Helper()
	p := NewPool(clock, Config{Limit: 1})
	if !granted(p.Enqueue(Ask{Scope: "holder", Since: clock.Now()})) {
		t.Fatal("the first ask of an empty pool waits")
	}
	ws := make([]*Waiter, len(asks))
	for i, a := range asks {
		ws[i] = p.Enqueue(a)
	}
	return p, ws
}

// grantedOf is the index of the one waiter of ws granted since seen, marking it seen.
func grantedOf(t *testing.T, ws []*Waiter, seen map[int]bool) int {
	t.Helper()
	for i, w := range ws {
		if granted(w) && !seen[i] {
			seen[i] = true
			return i
		}
	}
	t.Fatal("a release granted nobody")
	return -1
}

// A caller's Priority above the default orders its own key's work, not other tenants': a
// tenant's u=0 flood does not pass another tenant's default call.
func TestPoolUntrustedUrgencyOrdersOnlyItsOwnKey(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	asks := []Ask{
		{Urgency: 3, Scope: "loud", Since: t0.Add(1)},
		{Urgency: 0, Scope: "loud", Since: t0.Add(2)},
		{Urgency: 0, Scope: "loud", Since: t0.Add(3)},
		{Urgency: 3, Scope: "quiet", Since: t0.Add(4)},
		{Urgency: 5, Scope: "loud", Since: t0.Add(5)},
	}
	// loud's u=0 calls go before its own u=3 one, but quiet's call takes the second turn; the
	// u=5 call yields to everyone's default work, as a caller may always lower its standing.
	if got, want := order(t, clock, asks), []int{1, 3, 2, 0, 4}; !equal(got, want) {
		t.Fatalf("seats went to %v; want %v", got, want)
	}
}

// Claimed operations wait at their stored urgency, trusted, and keep what their caller asked for
// its own key's work as a lift (store.Operation.Lift): within the key the lifted one goes first,
// across keys it has no say.
func TestPoolAnOperationsLiftOrdersOnlyItsOwnKey(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	asks := []Ask{
		{Urgency: 3, Trusted: true, Scope: "loud", Since: t0.Add(1)},
		{Urgency: 3, Trusted: true, Lift: 3, Scope: "loud", Since: t0.Add(2)},
		{Urgency: 3, Trusted: true, Scope: "quiet", Since: t0.Add(3)},
		{Urgency: 3, Trusted: true, Lift: 1, Scope: "loud", Since: t0.Add(4)},
	}
	if got, want := order(t, clock, asks), []int{1, 2, 3, 0}; !equal(got, want) {
		t.Fatalf("seats went to %v; want %v", got, want)
	}
}

// A new fairness key per call (minted credentials) starts behind the waiting keys' next turns,
// not ahead of them (as a key with no turn record did): a tenant's backlog keeps its share of
// the keys waiting. With one fresh identity per seat freed, its k-th call waits behind at most
// k fresh ones, so its 6 calls are served within 6 + (1+2+...+6) = 27 seats.
func TestPoolNewKeysPerCallDoNotStarveABacklog(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	var asks []Ask
	for i := range 6 {
		asks = append(asks, Ask{Urgency: 3, Scope: "honest", Since: t0.Add(time.Duration(i))})
	}
	p, ws := fill(t, clock, asks)
	seen := map[int]bool{}
	honest, releases := 0, 0
	for ; honest < 6 && releases < 100; releases++ {
		clock.Advance(time.Millisecond)
		ws = append(ws, p.Enqueue(Ask{Urgency: 0, Scope: "minted-" + itoa(releases), Since: clock.Now()}))
		p.Release(nil, clock.Now(), Sample{Status: 200})
		if grantedOf(t, ws, seen) < 6 {
			honest++
		}
	}
	if releases > 27 {
		t.Fatalf("the backlog's 6 calls took %d seats against a new key per call; want at most 27", releases)
	}
}

// A key of weight 3 gets three seats to a weight-1 key's one while both have a backlog. Both
// were served before: a key's first call is a newcomer's, which takes the newcomers' one turn
// whatever its weight.
func TestPoolWeightsShareSeatsBetweenKeys(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	for _, a := range []Ask{{Urgency: 3, Scope: "light"}, {Urgency: 3, Scope: "heavy", Key: "tenant-heavy", Weight: 3}} {
		a.Since = clock.Now()
		w := p.Enqueue(a)
		if !granted(w) {
			t.Fatal("a call waits in an empty pool")
		}
		clock.Advance(time.Second)
		p.Release(w, clock.Now().Add(-time.Second), Sample{Status: 200})
	}
	if !granted(p.Enqueue(Ask{Scope: "holder", Since: clock.Now()})) {
		t.Fatal("the holder waits in an empty pool")
	}
	ws := make([]*Waiter, 0, 16)
	for i := range 8 {
		ws = append(ws, p.Enqueue(Ask{Urgency: 3, Scope: "light", Since: clock.Now().Add(time.Duration(2 * i))}),
			p.Enqueue(Ask{Urgency: 3, Scope: "heavy", Key: "tenant-heavy", Weight: 3, Since: clock.Now().Add(time.Duration(2*i + 1))}))
	}
	seen := map[int]bool{}
	heavy := 0
	var order []int
	for range 8 {
		p.Release(nil, clock.Now(), Sample{Status: 200})
		i := grantedOf(t, ws, seen)
		order = append(order, i%2)
		if i%2 == 1 {
			heavy++
		}
	}
	if heavy != 6 {
		t.Fatalf("the weight-3 key got %d of 8 seats (%v, 1: its); want 6", heavy, order)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TryTake takes a free seat only when nobody waits: the queue's head never passes a waiter.
func TestPoolTryTakeNeverPassesAWaiter(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 2})
	if _, ok := p.TryTake(); !ok {
		t.Fatal("a free seat with nobody waiting was not taken")
	}
	p.Enqueue(Ask{Scope: "a", Since: t0}) // the second seat
	w := p.Enqueue(Ask{Scope: "b", Since: t0})
	if _, ok := p.TryTake(); ok {
		t.Fatal("a seat was taken with none free")
	}
	p.GiveBack(nil)
	if !granted(w) {
		t.Fatal("the seat given back did not go to the waiter")
	}
	if _, ok := p.TryTake(); ok {
		t.Fatal("TryTake took a seat granted to a waiter")
	}
}

// Keys not served lately share one lane: a tenant served before keeps at least half the seats
// against any number of fresh identities, two arriving for every seat freed.
func TestPoolFreshIdentitiesShareOneTurnAgainstAKnownTenant(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	first := p.Enqueue(Ask{Scope: "honest", Since: t0}) // served once: known
	if !granted(first) {
		t.Fatal("the first ask of an empty pool waits")
	}
	var ws []*Waiter
	for i := range 12 {
		ws = append(ws, p.Enqueue(Ask{Scope: "honest", Since: t0.Add(time.Duration(i + 1))}))
	}
	seen := map[int]bool{}
	honest := 0
	for i := range 24 {
		clock.Advance(time.Millisecond)
		for j := range 2 {
			ws = append(ws, p.Enqueue(Ask{Urgency: 0, Scope: "minted-" + itoa(2*i+j), Since: clock.Now()}))
		}
		p.Release(nil, clock.Now(), Sample{Status: 200})
		if grantedOf(t, ws, seen) < 12 {
			honest++
		}
	}
	if honest < 12 {
		t.Fatalf("the known tenant got %d of 24 seats against fresh identities; want half, 12", honest)
	}
	// A new tenant with a backlog among the fresh identities takes turns with them, one key each.
	p2 := NewPool(clock, Config{Limit: 1})
	p2.Enqueue(Ask{Scope: "holder", Since: clock.Now()})
	for i := range 10 {
		p2.Enqueue(Ask{Scope: "big", Since: clock.Now().Add(time.Duration(i))})
	}
	small := p2.Enqueue(Ask{Scope: "small", Since: clock.Now().Add(time.Hour)})
	for range 2 {
		p2.Release(nil, clock.Now(), Sample{Status: 200})
	}
	if !granted(small) {
		t.Fatal("a new tenant's one call waited behind another new tenant's backlog, not a turn")
	}
}

// Turns charge the slot time a seat was held: with one seat and two tenants' backlogs, a tenant
// of 100 ms calls gets about ten seats to a tenant of 1 s calls' one (each gets half the slot
// time), and the long calls still get theirs.
func TestPoolTurnsShareSlotTimeNotCalls(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	var asks []Ask
	for i := range 100 {
		asks = append(asks, Ask{Scope: "long", Since: t0.Add(time.Duration(2 * i))},
			Ask{Scope: "short", Since: t0.Add(time.Duration(2*i + 1))})
	}
	p, ws := fill(t, clock, asks)
	p.Release(nil, clock.Now(), Sample{Status: 200}) // the holder's
	seen := map[int]bool{}
	short, long := 0, 0
	var slot [2]time.Duration
	for range 60 {
		i := grantedOf(t, ws, seen)
		hold := time.Second
		if i%2 == 1 {
			hold, short = 100*time.Millisecond, short+1
		} else {
			long++
		}
		start := clock.Now()
		clock.Advance(hold)
		slot[i%2] += hold
		p.Release(ws[i], start, Sample{Status: 200})
	}
	t.Logf("of 60 seats: short calls %d (%v), long calls %d (%v)", short, slot[1], long, slot[0])
	if short < 45 || long < 3 {
		t.Fatalf("of 60 seats, %d went to 100 ms calls and %d to 1 s calls; want about ten to one, both served", short, long)
	}
}

// A key that goes idle banks no turns: a tenant that sends its next call as soon as its last is
// granted (nothing of its own ever waits at a grant) gets half the seats against a backlog, as
// a tenant with a backlog of its own would, not every seat.
func TestPoolAKeyBackFromIdleStartsWhereItsLastTurnEnded(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	held := p.Enqueue(Ask{Scope: "holder", Since: clock.Now()})
	var ws []*Waiter
	for i := range 40 {
		ws = append(ws, p.Enqueue(Ask{Scope: "backlog", Since: t0.Add(time.Duration(i))}))
	}
	clock.Advance(time.Second)
	ws = append(ws, p.Enqueue(Ask{Scope: "eager", Since: clock.Now()}))
	seen := map[int]bool{}
	eager := 0
	for range 20 { // each call holds its seat 100 ms
		start := clock.Now()
		clock.Advance(100 * time.Millisecond)
		p.Release(held, start, Sample{Status: 200})
		i := grantedOf(t, ws, seen)
		held = ws[i]
		if i >= 40 {
			eager++
			clock.Advance(time.Millisecond)
			ws = append(ws, p.Enqueue(Ask{Scope: "eager", Since: clock.Now()}))
		}
	}
	if eager > 11 {
		t.Fatalf("a key never waiting at a grant got %d of 20 seats against a backlog; want about half", eager)
	}
}

// A key whose calls were short lately cannot take every seat at once by sending long ones: a
// grant charges it at least the pool's average, so in a burst of eight seats it gets about its
// half against a tenant of 1 s calls, not all eight (each charged its own 10 ms average).
func TestPoolAKeyOfShortCallsCannotTakeEverySeatWithLongOnes(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 8})
	serve := func(scope string, hold time.Duration) {
		w := p.Enqueue(Ask{Scope: scope, Since: clock.Now()})
		if !granted(w) {
			t.Fatal("a free seat was not granted")
		}
		start := clock.Now()
		clock.Advance(hold)
		p.Release(w, start, Sample{Status: 200})
	}
	for range 20 {
		serve("attacker", 10*time.Millisecond)
		serve("honest", time.Second)
	}
	var holders []*Waiter
	for range 8 {
		holders = append(holders, p.Enqueue(Ask{Scope: "holder", Since: clock.Now()}))
	}
	var ws []*Waiter
	for i := range 50 {
		ws = append(ws, p.Enqueue(Ask{Scope: "honest", Since: clock.Now().Add(time.Duration(2 * i))}),
			p.Enqueue(Ask{Scope: "attacker", Since: clock.Now().Add(time.Duration(2*i + 1))}))
	}
	start := clock.Now()
	clock.Advance(time.Second)
	for _, h := range holders {
		p.Release(h, start, Sample{Status: 200})
	}
	attacker := 0
	for i, w := range ws {
		if granted(w) && i%2 == 1 {
			attacker++
		}
	}
	if attacker > 5 {
		t.Fatalf("the key of short calls took %d of 8 seats at once; want about half", attacker)
	}
}

// A correction divides by the weight its grant divided by: a key whose lane weighed 1 when its
// weight-4 call was granted (a weight-1 call of the key had joined) gets back what it was
// charged, not a quarter of it.
func TestPoolACorrectionUsesTheWeightOfItsGrant(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	first := p.Enqueue(Ask{Scope: "k", Weight: 4, Since: clock.Now()})
	start := clock.Now()
	clock.Advance(time.Second)
	p.Release(first, start, Sample{Status: 200}) // k is known; its calls held 1 s
	holder := p.Enqueue(Ask{Scope: "holder", Since: clock.Now()})
	heavy := p.Enqueue(Ask{Scope: "k", Weight: 4, Since: clock.Now()})
	p.Enqueue(Ask{Scope: "k", Weight: 1, Since: clock.Now().Add(1)}) // the lane now weighs 1
	p.Release(holder, clock.Now(), Sample{Status: 200})
	if !granted(heavy) {
		t.Fatal("the key's first call was not granted")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	charged := p.keys.startOf("k")
	p.settleLocked(heavy, 10*time.Millisecond, true)
	if got, want := p.keys.startOf("k"), charged-(heavy.charged-10*time.Millisecond); got != want {
		t.Fatalf("after a 10 ms call charged %v, the key's turn is at %v; want %v", heavy.charged, got, want)
	}
}

// Virtual time runs as fast as all the seats together; past rebaseAt the turns move back near
// zero, in the same order, before a time.Duration could wrap.
func TestPoolTurnsRebaseBeforeVirtualTimeWraps(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	for _, k := range []string{"a", "b"} { // both known
		w := p.Enqueue(Ask{Scope: k, Since: clock.Now()})
		p.Release(w, clock.Now(), Sample{Status: 200})
	}
	p.mu.Lock()
	p.keys.vtime = rebaseAt - 1
	p.known["a"].finish, p.known["b"].finish = rebaseAt, rebaseAt+1
	p.mu.Unlock()
	holder := p.Enqueue(Ask{Scope: "holder", Since: clock.Now()})
	var ws []*Waiter
	for i := range 3 {
		ws = append(ws, p.Enqueue(Ask{Scope: "b", Since: clock.Now().Add(time.Duration(2 * i))}),
			p.Enqueue(Ask{Scope: "a", Since: clock.Now().Add(time.Duration(2*i + 1))}))
	}
	p.Release(holder, clock.Now(), Sample{Status: 200})
	seen := map[int]bool{}
	var got []int
	for range 6 {
		i := grantedOf(t, ws, seen)
		got = append(got, i%2)
		p.Release(ws[i], clock.Now(), Sample{Status: 200})
	}
	if want := []int{1, 0, 1, 0, 1, 0}; !equal(got, want) { // a's turn first, then in turn
		t.Fatalf("grants went to %v (1: a, 0: b); want %v", got, want)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keys.vtime > time.Hour || p.known["a"].finish > time.Hour {
		t.Fatalf("virtual time %v, a's finish %v: not rebased", p.keys.vtime, p.known["a"].finish)
	}
}

// Fresh identities sending long calls pay what their lane's calls held: once the newcomers'
// 60 s calls have ended, a grant in their lane charges 60 s, and over the next minutes they hold
// about their half of 8 seats against a tenant of 1 s calls (5 at most on average). In their
// first minute, before any of their calls ended, the running calls pay as they go, so they do
// not take all 8 (6 at most; all 8 when calls paid only at their end). Charged the pool's
// average instead, they held 6.4 of 8 on average throughout.
func TestPoolFreshIdentitiesWithLongCallsPayWhatTheirLaneHeld(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 8})
	type call struct {
		w      *Waiter
		start  time.Time
		minted bool
	}
	var waiting, running []call
	minted := 0
	var mintedSeats, steps, firstMinute int
	for step := range 3000 { // 100 ms each: five minutes
		now := clock.Now()
		kept := running[:0]
		for _, c := range running {
			hold := time.Second
			if c.minted {
				hold = time.Minute
			}
			if now.Sub(c.start) >= hold {
				p.Release(c.w, c.start, Sample{Status: 200})
				continue
			}
			kept = append(kept, c)
		}
		running = kept
		honest, fresh := 0, 0
		for _, c := range waiting {
			if c.minted {
				fresh++
			} else {
				honest++
			}
		}
		for ; honest < 10; honest++ {
			waiting = append(waiting, call{w: p.Enqueue(Ask{Scope: "honest", Since: now})})
		}
		for ; fresh < 10; fresh++ {
			minted++
			waiting = append(waiting, call{w: p.Enqueue(Ask{Scope: "minted-" + itoa(minted), Since: now}), minted: true})
		}
		still := waiting[:0]
		for _, c := range waiting {
			if granted(c.w) {
				c.start = now
				running = append(running, c)
				continue
			}
			still = append(still, c)
		}
		waiting = still
		n := 0
		for _, c := range running {
			if c.minted {
				n++
			}
		}
		if step < 600 { // the first minute, before any of their calls ended
			firstMinute = max(firstMinute, n)
		}
		if step >= 900 { // past the first wave's end and its calls' settling
			mintedSeats += n
			steps++
		}
		clock.Advance(100 * time.Millisecond)
	}
	mean := float64(mintedSeats) / float64(steps)
	t.Logf("fresh identities held %.1f of 8 seats on average after their first calls ended, at most %d in their first minute", mean, firstMinute)
	if firstMinute > 6 {
		t.Fatalf("fresh identities with 60 s calls held %d of 8 seats in their first minute; want at most 6 (their calls pay as they run)", firstMinute)
	}
	if mean > 5 {
		t.Fatalf("fresh identities with 60 s calls held %.1f of 8 seats on average after their first calls ended; want about half", mean)
	}
}

// A tenant served more than once keeps its own turn however many fresh identities are served
// once after it: the pool forgets the keys served once before those that came back. It forgot
// the half served longest ago, so 5,000 one-call identities pushed the tenant out, and its next
// call waited as a newcomer behind the 50 fresh identities waiting then.
func TestPoolATenantServedAgainOutlastsAFloodOfFreshIdentities(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	serve := func(scope string) {
		t.Helper()
		w := p.Enqueue(Ask{Scope: scope, Since: clock.Now()})
		if !granted(w) {
			t.Fatalf("%s waits in an empty pool", scope)
		}
		clock.Advance(time.Millisecond)
		p.Release(w, clock.Now().Add(-time.Millisecond), Sample{Status: 400})
	}
	serve("honest")
	serve("honest")
	for i := range 5000 {
		serve("minted-" + itoa(i))
	}
	holder := p.Enqueue(Ask{Scope: "holder", Since: clock.Now()})
	if !granted(holder) {
		t.Fatal("the holder waits in an empty pool")
	}
	var ws []*Waiter
	for i := range 50 {
		ws = append(ws, p.Enqueue(Ask{Scope: "fresh-" + itoa(i), Since: clock.Now()}))
	}
	honest := p.Enqueue(Ask{Scope: "honest", Since: clock.Now()})
	ahead := 0
	p.Release(holder, clock.Now(), Sample{Status: 200})
	for !granted(honest) && ahead < len(ws) {
		ahead++
		p.Release(nil, clock.Now(), Sample{Status: 200})
	}
	if ahead > 1 {
		t.Fatalf("the tenant served twice waited behind %d fresh identities; want at most the newcomers' one turn", ahead)
	}
}

// The pool's waiting counts (mulligan_capacity_waiting, /mulligan/stats) are by the urgency a
// call waits at: a caller's forged u=0 shows as the default it competes at, a trusted class's as
// its own. They were by the urgency asked, so a forged flood showed as an urgent backlog.
func TestPoolWaitingIsCountedAtTheUrgencyItWaitsAt(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	p.Enqueue(Ask{Scope: "holder", Since: t0})
	p.Enqueue(Ask{Scope: "forger", Urgency: 0, Since: t0})
	p.Enqueue(Ask{Scope: "ops", Urgency: 1, Trusted: true, Since: t0})
	if w := p.Snapshot().Waiting; w[0] != 0 || w[1] != 1 || w[store.DefaultUrgency] != 1 {
		t.Fatalf("waiting by urgency %v; want the trusted u=1 at 1 and the forged u=0 at %d", w, store.DefaultUrgency)
	}
}

// poolWithAKnownTenant is a one-seat pool that served tenant "known" once, its seat now held by
// another tenant's call (holder).
func poolWithAKnownTenant() (*clockwork.FakeClock, *Pool, *Waiter) {
	clock := clockwork.NewFakeClockAt(t0)
	p := NewPool(clock, Config{Limit: 1})
	first := p.Enqueue(Ask{Scope: "known", Since: clock.Now()})
	clock.Advance(time.Second)
	p.Release(first, clock.Now().Add(-time.Second), Sample{Status: 200})
	return clock, p, p.Enqueue(Ask{Scope: "holder", Since: clock.Now()})
}

// A new tenant whose calls never stop waiting (a client that sends its next call as one ends)
// gets a lane of its own once served, and its share of the seats against a known tenant and a
// stream of fresh identities: a third each. Kept among the newcomers while any of its calls
// waited there, it stayed a newcomer for ever and got 28 of 600 seats.
func TestPoolANewTenantThatAlwaysWaitsGetsALaneOfItsOwn(t *testing.T) {
	clock, p, holder := poolWithAKnownTenant()
	waiting := map[*Waiter]string{}
	fresh := 0
	enqueue := func(scope string) {
		waiting[p.Enqueue(Ask{Scope: scope, Since: clock.Now()})] = scope
	}
	for range 3 {
		enqueue("known")
		enqueue("new")
	}
	for range 10 {
		enqueue("fresh-" + itoa(fresh))
		fresh++
	}
	got := map[string]int{}
	last := holder
	for range 600 {
		clock.Advance(time.Second)
		p.Release(last, clock.Now().Add(-time.Second), Sample{Status: 200})
		var served *Waiter
		for w, scope := range waiting {
			if granted(w) {
				served = w
				delete(waiting, w)
				if strings.HasPrefix(scope, "fresh-") {
					got["fresh"]++
					enqueue("fresh-" + itoa(fresh))
					fresh++
				} else {
					got[scope]++
					enqueue(scope)
				}
				break
			}
		}
		if served == nil {
			t.Fatal("a release granted nobody")
		}
		last = served
	}
	t.Logf("of 600 seats: known %d, new %d, fresh identities %d", got["known"], got["new"], got["fresh"])
	if got["new"] < 150 {
		t.Fatalf("the new tenant that always waits got %d of 600 seats; want about a third", got["new"])
	}
}

// A new key's burst holds one lane once the key is served: its calls sent before that move
// from the newcomers' lane to its own, where its later calls wait, so against a known tenant
// that keeps as many waiting it gets half the seats. They stayed among the newcomers, taking
// the newcomers' turns while its later calls took its own lane's: 25 of 41 seats. The burst's
// next call goes behind the new key that waits longest among the newcomers.
func TestPoolANewKeysBurstHoldsOneLane(t *testing.T) {
	clock, p, holder := poolWithAKnownTenant()
	waiting := map[*Waiter]string{}
	for range 20 {
		waiting[p.Enqueue(Ask{Scope: "known", Since: clock.Now()})] = "known"
	}
	for range 20 {
		waiting[p.Enqueue(Ask{Scope: "burst", Since: clock.Now()})] = "burst"
	}
	other := p.Enqueue(Ask{Scope: "other", Since: clock.Now()})
	waiting[other] = "other"
	var order []string
	last := holder
	for range 41 {
		clock.Advance(time.Second)
		p.Release(last, clock.Now().Add(-time.Second), Sample{Status: 200})
		last = nil
		for w, scope := range waiting {
			if granted(w) {
				last = w
				delete(waiting, w)
				order = append(order, scope)
				if scope != "other" { // each keeps its backlog: a call sent as one gets its seat
					waiting[p.Enqueue(Ask{Scope: scope, Since: clock.Now()})] = scope
				}
				break
			}
		}
		if last == nil {
			t.Fatal("a release granted nobody")
		}
	}
	got := map[string]int{}
	for _, s := range order {
		got[s]++
	}
	t.Logf("order of the first 41 seats: %v", order)
	if got["burst"] > 21 {
		t.Fatalf("the new key's burst got %d of 41 seats against a known tenant's backlog and one other new key; want about half", got["burst"])
	}
	if i, j := slices.Index(order, "other"), slices.Index(order, "burst"); i < 0 || i > slices.Index(order[j+1:], "burst")+j+1 {
		t.Fatalf("the other new key's call was served after the burst's second call (%v); want before it", order)
	}
}

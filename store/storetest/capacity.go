package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// The capacity order (docs/backends.md): effective urgency, then the scopes' turns, then the
// oldest; stale work is never claimed and fails QUEUE_TIMEOUT.
var capacityTests = []test{
	{"ScopesTakeTurnsWithinAnUrgency", testScopesTakeTurns},
	{"UrgentWorkIsClaimedFirst", testUrgentFirst},
	{"WaitingRaisesUrgency", testAging},
	{"StaleWorkIsNotClaimedAndFailsQueueTimeout", testStaleQueued},
	{"RequeuedWorkHasNoQueueDeadline", testRequeuedNotStale},
	{"PositionsEstimateTheClaimOrder", testQueuePositions},
	{"PositionsCountTheNewcomersAsOneTurn", testQueuePositionsWithNewcomers},
	{"PositionOfALaneWithATurnIsFromItsOldestWork", testPositionOfAKnownLaneIsStable},
	{"ANewLaneStartsAtTheVirtualTime", testKnownLaneTurnIsTheClaimsTime},
	{"ConcurrentClaimersTakeEachOperationOnceAcrossScopesAndUrgencies", testOrderedClaimsAreExclusive},
	{"LookingThenClaimingByIDKeepsTheClaimOrder", testPeekThenClaim},
	{"NewScopesTakeTheirTurnBehindABacklogNotAheadOfIt", testNewScopesWaitTheirTurn},
	{"NewcomersOfOneBandDoNotHoldBackAnothers", testNewcomersTurnPerBand},
	{"ALightTenantKeepsItsTurnBetweenItsOperations", testLightTenantKeepsItsTurn},
	{"FairnessKeysTakeTurnsWhateverTheirScopes", testFairKeysTakeTurns},
	{"AKeyOfWeightTwoTakesTwoClaimsPerTurn", testWeightedKeys},
	{"ClaimingByIDTakesTheKeysTurn", testClaimByIDTakesTheKeysTurn},
	{"AFairnessKeyThatIsNotTextIsKeptAndTakesItsTurns", testFairKeyNotText},
	{"ACallersOwnPriorityOrdersItsOwnLanesWork", testOwnUrgencyOrdersItsLane},
	{"ACallersOwnPriorityMovesItNotAheadOfOtherLanes", testOwnUrgencyNotAcrossLanes},
	{"ALaneThatPicksNewerWorkKeepsItsOldestWorksPlace", testOwnUrgencyKeepsTheLanesPlace},
	{"ClaimingByIDWorkBehindAnAgedHeadOfItsGroup", testClaimByIDBehindAnAgedHead},
	{"ClaimingByIDNewerWorkGivesTheLaneItsTurnInItsBand", testClaimByIDTurnFromOlderWork},
	{"LanesShareSlotTimeNotClaims", testLanesShareSlotTime},
	{"FreshScopesWithLongRunsPayTheirSlotTime", testNewcomersPaySlotTime},
	{"RunsCountInTheirTurnsAsTheyRun", testRunsCountAsTheyRun},
	{"UrgentClaimsLeaveTheDefaultBandsTurnsAlone", testUrgentClaimsLeaveTheDefaultBand},
	{"ALaneServedInOneBandWaitsItsTurnInAnother", testTurnInAnotherBand},
	{"ARunCountsInTheBandItWasClaimedIn", testRunCountsInItsBand},
}

// A tenant's default-urgency operation runs on, far past its charge, while its urgent work and
// another lane's urgent backlog wait: the run counts in the default band only, where its end
// charges it, so the tenant's urgent operation is claimed within two of the urgent band's
// claims. Counted in every band, the run held the tenant back in the urgent band until it
// ended, and its end charged nothing there.
func testRunCountsInItsBand(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "tenant", 0, 1, store.DefaultUrgency, time.Time{})
	long := must(b.ClaimNext("w1", time.Hour))(t)
	if long == nil || long.Scope != "tenant" {
		t.Fatalf("claimed %+v, want the tenant's", long)
	}
	e.acceptAt(t, b, "urgent", 100, 30, store.MostUrgent+1, time.Time{})
	took := map[string]time.Duration{"tenant": 100 * time.Millisecond, "urgent": 100 * time.Millisecond}
	e.runNext(t, b, took, sameLane)
	e.clock.Advance(10 * time.Minute) // the tenant's run goes on
	e.acceptAt(t, b, "tenant", 200, 1, store.MostUrgent+1, time.Time{})
	e.expectRunWithin(t, b, took, "tenant", 2, "the tenant's urgent operation (its default-urgency run held it back)")
}

// A tenant served twenty times at the default urgency sends one urgent operation while another
// lane's urgent backlog waits: the tenant has no turn in the urgent band and starts at its
// virtual time, so its operation is claimed within two of the band's claims. With one turn for
// every band, its turn was twenty runs ahead of the urgent band's, and the backlog went first
// until it caught up.
func testTurnInAnotherBand(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "tenant", 0, 20, store.DefaultUrgency, time.Time{})
	took := map[string]time.Duration{"tenant": 100 * time.Millisecond, "urgent": 100 * time.Millisecond}
	for range 20 {
		e.runNext(t, b, took, sameLane)
	}
	e.acceptAt(t, b, "urgent", 100, 30, store.MostUrgent+1, time.Time{})
	e.runNext(t, b, took, sameLane)
	e.acceptAt(t, b, "tenant", 200, 1, store.MostUrgent+1, time.Time{})
	e.expectRunWithin(t, b, took, "tenant", 2, "the tenant's urgent operation")
}

// expectRunWithin runs operations one at a time (runNext, each its lane's time in took) and
// fails unless one of lane's is claimed within the first n, what naming it.
func (e *env) expectRunWithin(t *testing.T, b store.Backend, took map[string]time.Duration, lane string, n int, what string) {
	t.Helper()
	for i := range 10 {
		if e.runNext(t, b, took, sameLane) == lane {
			if i >= n {
				t.Fatalf("%s was claimed at claim %d; want within %d", what, i+1, n)
			}
			return
		}
	}
	t.Fatalf("%s was not claimed in 10 claims", what)
}

// sameLane is runNext's lane of a scope: the scope itself.
func sameLane(scope string) string { return scope }

// A backlog and a newer lane's one operation wait at the default urgency while a trusted urgent
// lane is claimed twice for each of theirs: each band keeps its own virtual time, so the newer
// lane is claimed within the band's first three claims. With one virtual time for every band,
// the urgent claims moved it past the default band's turns, which then all started there and
// went oldest first: the whole backlog before the newer lane.
func testUrgentClaimsLeaveTheDefaultBand(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "backlog", 0, 30, store.DefaultUrgency, time.Time{})
	e.clock.Advance(time.Millisecond)
	e.acceptAt(t, b, "newer", 100, 1, store.DefaultUrgency, time.Time{})
	for i := range 10 {
		e.acceptAt(t, b, "urgent", 200+2*i, 2, store.MostUrgent, time.Time{})
		for range 2 {
			if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.Scope != "urgent" {
				t.Fatalf("claimed %+v, want the urgent lane's", op)
			}
		}
		if op := must(b.ClaimNext("w1", time.Minute))(t); op != nil && op.Scope == "newer" {
			if i > 2 {
				t.Fatalf("the newer lane was claimed at the default band's claim %d; want within 3", i+1)
			}
			return
		}
	}
	t.Fatal("the newer lane was not claimed in 10 of the default band's claims")
}

// Two tenants whose operations ran 100 ms each, four slots: tenant a's turn to hour-long runs
// counts as they run past what their claims charged, so tenant b, whose runs still take 100 ms,
// gets the slots its runs free; a keeps the slots it holds, no more. Counted only at their ends,
// a's runs took the slots b's freed, one in two, until a held all four.
func testRunsCountAsTheyRun(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "a", 0, 5, store.DefaultUrgency, time.Time{})
	e.acceptAt(t, b, "b", 100, 5, store.DefaultUrgency, time.Time{})
	took := map[string]time.Duration{"a": 100 * time.Millisecond, "b": 100 * time.Millisecond}
	for range 10 {
		e.runNext(t, b, took, sameLane)
	}
	e.acceptAt(t, b, "a", 10, 30, store.DefaultUrgency, time.Time{})
	e.acceptAt(t, b, "b", 200, 30, store.DefaultUrgency, time.Time{})
	var running []*store.Operation
	fill := func() {
		for len(running) < 4 {
			op := must(b.ClaimNext("w1", time.Hour))(t)
			if op == nil {
				t.Fatal("nothing to claim")
			}
			running = append(running, op)
		}
	}
	held := func() int {
		n := 0
		for _, op := range running {
			if op.Scope == "a" {
				n++
			}
		}
		return n
	}
	fill()
	first := held()
	for range 20 {
		e.clock.Advance(100 * time.Millisecond)
		var still []*store.Operation
		for _, op := range running {
			if op.Scope == "a" {
				still = append(still, op) // an hour
				continue
			}
			if _, err := b.Transition(op.ID, store.Change{To: store.StatusSucceeded, Holder: "w1"}); err != nil {
				t.Fatal(err)
			}
		}
		running = still
		fill()
	}
	t.Logf("the tenant whose runs turned long held %d of 4 slots, then %d", first, held())
	if n := held(); n > first+1 {
		t.Fatalf("the tenant whose runs turned long holds %d of 4 slots, from %d; want no more than one more", n, first)
	}
}

// runNext claims the next operation, runs it for its lane's time in took (the clock moves on by
// it) and ends it succeeded; it returns the operation's scope, "" when nothing was claimed.
func (e *env) runNext(t *testing.T, b store.Backend, took map[string]time.Duration, byScope func(string) string) string {
	t.Helper()
	op := must(b.ClaimNext("w1", time.Minute))(t)
	if op == nil {
		return ""
	}
	lane := byScope(op.Scope)
	e.clock.Advance(took[lane])
	if _, err := b.Transition(op.ID, store.Change{To: store.StatusSucceeded, Holder: "w1"}); err != nil {
		t.Fatal(err)
	}
	return lane
}

// Two tenants with backlogs, one whose operations run 400 ms and one whose run 100 ms, one at a
// time: the turns charge the slot time each run took, so the short tenant gets about four claims
// to the long one's and the two about the same slot time. Counting claims, they took one each in
// turn, and the long tenant four times the slot time.
func testLanesShareSlotTime(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "long", 0, 40, store.DefaultUrgency, time.Time{})
	e.acceptAt(t, b, "short", 100, 100, store.DefaultUrgency, time.Time{})
	took := map[string]time.Duration{"long": 400 * time.Millisecond, "short": 100 * time.Millisecond}
	slot := map[string]time.Duration{}
	claims := map[string]int{}
	for range 50 {
		lane := e.runNext(t, b, took, sameLane)
		slot[lane] += took[lane]
		claims[lane]++
	}
	t.Logf("slot time long %v, short %v; claims %v", slot["long"], slot["short"], claims)
	if r := slot["long"].Seconds() / slot["short"].Seconds(); r < 0.7 || r > 1.4 {
		t.Fatalf("slot time long %v, short %v (claims %v); want about the same", slot["long"], slot["short"], claims)
	}
	drain(t, b, 200)
}

// A tenant's backlog of 100 ms operations against a fresh scope per operation whose runs take
// 1 s, one arriving for every claim: the fresh scopes share the newcomers' turn, which each run
// moves on by the time it took, so the tenant keeps about half the slot time, not one claim in
// two (a tenth of it).
func testNewcomersPaySlotTime(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "honest", 0, 100, store.DefaultUrgency, time.Time{})
	took := map[string]time.Duration{"honest": 100 * time.Millisecond, "minted": time.Second}
	lane := func(s string) string {
		if s == "honest" {
			return s
		}
		return "minted"
	}
	slot := map[string]time.Duration{}
	for i := range 60 {
		e.acceptAt(t, b, fmt.Sprint("minted-", i), 1000+i, 1, store.DefaultUrgency, time.Time{})
		l := e.runNext(t, b, took, lane)
		slot[l] += took[l]
	}
	t.Logf("slot time: the tenant %v, the fresh scopes %v", slot["honest"], slot["minted"])
	if share := slot["honest"].Seconds() / (slot["honest"] + slot["minted"]).Seconds(); share < 0.35 {
		t.Fatalf("the tenant's backlog got %.0f %% of the slot time (%v against %v); want about half", 100*share, slot["honest"], slot["minted"])
	}
	drain(t, b, 200)
}

// A lane's two u=7 operations, the older aged a level further: a claim by id of the newer, whose
// group's head is at a more urgent band, claims it (PostgreSQL failed it, finding no work of the
// lane at its band to count the lane's turn from).
func testClaimByIDBehindAnAgedHead(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "a", 0, 1, store.LeastUrgent, time.Time{})
	e.clock.Advance(2 * store.AgingStep)
	e.acceptAt(t, b, "a", 1, 1, store.LeastUrgent, time.Time{})
	e.clock.Advance(store.AgingStep) // op 0 at band 4, op 1 at band 6
	if op := must(b.ClaimQueued(opID(1), "w1", time.Minute))(t); op == nil || op.ID != opID(1) {
		t.Fatalf("claiming %s by id: %+v", opID(1), op)
	}
}

// A weighted lane's first claim, by id, of newer work aged less gives the lane its turn in that
// work's band only: at its older work's band the lane starts level with lane b, never served,
// and its older work goes first, then b's; on every backend (PostgreSQL once counted the lane's
// turn from a newer group head where Badger did not).
func testClaimByIDTurnFromOlderWork(t *testing.T, e *env) {
	b := e.open()
	put := func(i int, scope, key string, w float64, u int) {
		op := e.newOp(i, scope)
		op.Urgency, op.FairKey, op.Weight = u, key, w
		if _, err := b.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	put(0, "h", "key:h", 2, store.LeastUrgent)
	e.clock.Advance(2 * store.AgingStep)
	put(1, "h", "key:h", 2, store.LeastUrgent)
	e.clock.Advance(store.AgingStep / 2)
	put(3, "b", "", 1, store.LeastUrgent-3)
	e.clock.Advance(store.AgingStep / 2)
	put(2, "h", "key:h", 2, store.LeastUrgent-1)
	if op := must(b.ClaimQueued(opID(1), "w1", time.Minute))(t); op == nil {
		t.Fatalf("claiming %s by id found nothing", opID(1))
	}
	if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.ID != opID(0) {
		t.Fatalf("claimed %+v next; want %s: lane h's claim of %s was in another band", op, opID(0), opID(1))
	}
	if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.ID != opID(3) {
		t.Fatalf("claimed %+v next; want %s", op, opID(3))
	}
}

// acceptLift stores operations from..from+n-1 of scope, queued at the default urgency with lift
// (store.Operation.Lift): their caller asked lift levels more, for its own work.
func (e *env) acceptLift(t *testing.T, b store.Backend, scope string, from, n, lift int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		op := e.newOp(i, scope)
		op.Lift = lift
		if _, err := b.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil); err != nil {
			t.Fatalf("accept %s: %v", opID(i), err)
		}
	}
}

// Scope a queues three operations at the default urgency, then one it asked u=0 for and one u=2
// (lifts 3 and 1); scope b two. Within a's lane its own urgency orders its work, u=0 first, by
// ClaimNext and by a look then a claim by id alike, and the estimates say so; a's place against
// b's is its oldest work's, so the lanes still take turns. Without the lift a's were claimed
// oldest first.
func testOwnUrgencyOrdersItsLane(t *testing.T, e *env) {
	for _, byID := range []bool{false, true} {
		t.Run(map[bool]string{false: "ClaimNext", true: "ClaimQueued"}[byID], func(t *testing.T) {
			b, other := e.open(), e.open()
			base, a, bb := 0, "a", "b"
			if byID {
				base, a, bb = 100, "a-by-id", "b-by-id"
			}
			e.acceptAt(t, b, a, base, 3, store.DefaultUrgency, time.Time{})
			e.acceptLift(t, b, a, base+3, 1, 3)
			e.acceptLift(t, b, a, base+4, 1, 1)
			e.acceptAt(t, b, bb, base+5, 2, store.DefaultUrgency, time.Time{})
			if p := must(b.QueuePosition(opID(base + 3)))(t); p != 0 {
				t.Errorf("%s, asked u=0, is estimated at %d; want 0", opID(base+3), p)
			}
			if p4, p0 := must(b.QueuePosition(opID(base+4)))(t), must(b.QueuePosition(opID(base)))(t); p4 >= p0 {
				t.Errorf("%s, asked u=2, is estimated at %d, not before %s at %d", opID(base+4), p4, opID(base), p0)
			}
			var got []string
			if byID {
				got = peekThenClaim(t, b, other, 20)
			} else {
				got = drain(t, b, 20)
			}
			want := []string{opID(base + 3), opID(base + 5), opID(base + 4), opID(base + 6), opID(base), opID(base + 1), opID(base + 2)}
			if !slices.Equal(got, want) {
				t.Fatalf("claimed %v,\nwant %v", got, want)
			}
		})
	}
}

// A caller's own Priority is no word across lanes: newcomers asking u=0 (lift 3) beside one at
// the default go oldest first with it, and the backlog keeps every other claim (the newcomers
// first: their turn stands just before the backlog's next, store.NewcomersAfter).
func testOwnUrgencyNotAcrossLanes(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "backlog", 0, 5, store.DefaultUrgency, time.Time{})
	must(b.ClaimNext("w1", time.Minute))(t) // the backlog's lane has a turn from now on
	e.clock.Advance(time.Millisecond)
	e.acceptAt(t, b, "n1", 10, 1, store.DefaultUrgency, time.Time{})
	e.acceptLift(t, b, "n2", 11, 1, 3)
	e.acceptLift(t, b, "n3", 12, 1, 3)
	expectDrain(t, b, opIDs([]int{10, 1, 11, 2, 12, 3, 4}, 0, 0))
}

// Two new lanes whose turns tie go oldest first, a lane's place counted from its oldest work:
// lane a's older operation puts a before lane b, and a then claims its newer work, asked u=0,
// first. Counted from the work it picks, a would wait behind b.
func testOwnUrgencyKeepsTheLanesPlace(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "a", 0, 1, store.DefaultUrgency, time.Time{})
	e.clock.Advance(time.Millisecond)
	e.acceptAt(t, b, "b", 1, 1, store.DefaultUrgency, time.Time{})
	e.clock.Advance(time.Millisecond)
	e.acceptLift(t, b, "a", 2, 1, 3)
	expectDrain(t, b, opIDs([]int{2, 1, 0}, 0, 0))
}

// expectNext claims the next operation and fails unless it is the i-th.
func expectNext(t *testing.T, b store.Backend, i int) {
	t.Helper()
	if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.ID != opID(i) {
		t.Fatalf("claimed %+v; want %s", op, opID(i))
	}
}

// A fairness key made of a caller's bytes (not UTF-8, a NUL) is stored like any other, and its
// work takes its turns: a storage never refuses an operation for it.
func testFairKeyNotText(t *testing.T, e *env) {
	b := e.open()
	e.acceptKeyed(t, b, "s1", "key:a\xff\x00b", 0, 0, 2)
	e.acceptKeyed(t, b, "s2", "key:other", 0, 2, 1)
	if _, err := b.QueuePosition(opID(1)); err != nil {
		t.Fatal(err)
	}
	expectDrain(t, b, opIDs([]int{0, 2, 1}, 0, 0))
}

// acceptKeyed stores operations from..from+n-1 of scope with fairness key key and weight w,
// queued at the default urgency.
func (e *env) acceptKeyed(t *testing.T, b store.Backend, scope, key string, w float64, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		op := e.newOp(i, scope)
		op.FairKey, op.Weight = key, w
		if _, err := b.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil); err != nil {
			t.Fatalf("accept %s: %v", opID(i), err)
		}
	}
}

// One tenant (fair_key acme) under three credentials (scopes) queues 18 operations, then
// another tenant 2: the turns are the key's, not the scopes', so the other tenant's go second
// and fourth, not after one of each of acme's credentials.
func testFairKeysTakeTurns(t *testing.T, e *env) {
	b := e.open()
	for i, scope := range []string{"s1", "s2", "s3"} {
		e.acceptKeyed(t, b, scope, "key:acme", 0, 6*i, 6)
	}
	e.acceptAt(t, b, "b", 18, 2, store.DefaultUrgency, time.Time{})
	expectDrain(t, b, opIDs([]int{0, 18, 1, 19}, 2, 18))
}

// opIDs are the ids of operations first, then from..to-1.
func opIDs(first []int, from, to int) []string {
	var out []string
	for _, i := range first {
		out = append(out, opID(i))
	}
	for i := from; i < to; i++ {
		out = append(out, opID(i))
	}
	return out
}

// expectDrain drains b and fails unless it claimed want, in that order.
func expectDrain(t *testing.T, b store.Backend, want []string) {
	t.Helper()
	if got := drain(t, b, len(want)+10); !slices.Equal(got, want) {
		t.Fatalf("claimed %v,\nwant %v", got, want)
	}
}

// A key of weight 2 takes two claims per turn of a weight-1 key while both have work.
func testWeightedKeys(t *testing.T, e *env) {
	b := e.open()
	e.acceptKeyed(t, b, "h", "key:heavy", 2, 0, 10)
	e.acceptKeyed(t, b, "l", "key:light", 1, 10, 10)
	expectDrain(t, b, opIDs([]int{0, 1, 10, 2, 3, 11, 4, 5, 12, 6, 7, 13, 8, 9, 14}, 15, 20))
}

// The runner under capacity claims by id (ClaimQueued) the operation it looked at: that claim
// takes its key's turn as ClaimNext would.
func testClaimByIDTakesTheKeysTurn(t *testing.T, e *env) {
	b, other := e.open(), e.open()
	e.acceptKeyed(t, b, "s1", "key:acme", 0, 0, 2)
	e.acceptKeyed(t, b, "s2", "key:acme", 0, 2, 2)
	e.acceptAt(t, b, "b", 4, 2, store.DefaultUrgency, time.Time{})
	got := peekThenClaim(t, b, other, 10)
	want := []string{opID(0), opID(4), opID(1), opID(5), opID(2), opID(3)}
	if !slices.Equal(got, want) {
		t.Fatalf("claimed %v,\nwant %v", got, want)
	}
}

// A tenant with a backlog against a new scope (a fresh credential) per call, two arriving for
// every claim: the new scopes share one turn (store.NewcomersTurn), so the backlog gets every
// other claim, by ClaimNext and by a look then a claim by id alike. Each new scope counting as
// served when it came, the backlog got 3 of 11 claims and ever fewer as the flood went on (its
// k-th claim came after about 3^k new scopes'); a scope without a turn going first always, none
// after its first.
func testNewScopesWaitTheirTurn(t *testing.T, e *env) {
	for _, byID := range []bool{false, true} {
		t.Run(map[bool]string{false: "ClaimNext", true: "ClaimQueued"}[byID], func(t *testing.T) {
			b := e.open()
			base, honestScope := 0, "honest"
			if byID {
				base, honestScope = 1000, "honest-by-id"
			}
			const claims = 30
			e.acceptAt(t, b, honestScope, base, claims, store.DefaultUrgency, time.Time{})
			honest := 0
			for i := range claims {
				e.clock.Advance(time.Millisecond)
				for j := range 2 {
					n := base + 100 + 2*i + j
					e.acceptAt(t, b, "minted-"+fmt.Sprint(n), n, 1, store.DefaultUrgency, time.Time{})
				}
				var op *store.Operation
				if byID {
					next := must(b.NextQueued())(t)
					op = must(b.ClaimQueued(next.ID, "w1", time.Minute))(t)
				} else {
					op = must(b.ClaimNext("w1", time.Minute))(t)
				}
				if op != nil && op.Scope == honestScope {
					honest++
				}
			}
			if honest < claims/2-1 {
				t.Fatalf("the backlog got %d of %d claims; want at least %d", honest, claims, claims/2-1)
			}
			drain(t, b, 10*claims)
		})
	}
}

// A backlog and one operation of a scope seen for the first time, both at the default urgency;
// between their claims a trusted urgent (u=1) operation of a fresh key each time is claimed. The
// newcomers' turn is kept per band, so the urgent newcomers' claims leave the default band's
// as it was and the new scope's operation is claimed within two of the band's claims. With one
// turn for every band it was never claimed: each urgent newcomer moved it past the backlog's.
func testNewcomersTurnPerBand(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "batch", 0, 30, store.DefaultUrgency, time.Time{})
	e.clock.Advance(time.Millisecond)
	must(b.ClaimNext("w1", time.Minute))(t) // the backlog's lane has a turn from now on
	e.clock.Advance(time.Millisecond)
	e.acceptAt(t, b, "light", 100, 1, store.DefaultUrgency, time.Time{})
	for i := range 20 {
		e.clock.Advance(time.Millisecond)
		e.acceptAt(t, b, fmt.Sprintf("vip-%d", i), 200+i, 1, store.DefaultUrgency-2, time.Time{})
		if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.ID != opID(200+i) {
			t.Fatalf("claimed %+v, want the urgent %s", op, opID(200+i))
		}
		e.clock.Advance(time.Millisecond)
		if op := must(b.ClaimNext("w1", time.Minute))(t); op != nil && op.Scope == "light" {
			if i >= 2 {
				t.Fatalf("the new scope's operation was claimed at the band's claim %d, want within 2", i+1)
			}
			return
		}
	}
	t.Fatal("the new scope's operation was never claimed: every default-urgency claim went to the backlog")
}

// A tenant whose operations come one at a time, each ending before the next, keeps its own turn
// meanwhile (store.LaneStart, store.KeepIdleLanes, store.KeepIdleLanesFor): against a backlog and
// two fresh scopes a claim, its next operation is claimed within three claims. When a lane left
// without work forgot its turn at once, it waited with the newcomers behind every fresh scope
// queued before it.
func testLightTenantKeepsItsTurn(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "light", 0, 1, store.DefaultUrgency, time.Time{})
	if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.ID != opID(0) {
		t.Fatalf("claimed %+v, want %s", op, opID(0))
	}
	if _, err := b.Transition(opID(0), store.Change{To: store.StatusSucceeded, Holder: "w1"}); err != nil {
		t.Fatal(err)
	}
	e.acceptAt(t, b, "batch", 1, 40, store.DefaultUrgency, time.Time{})
	for i := range 30 {
		e.clock.Advance(time.Millisecond)
		e.acceptAt(t, b, "minted-"+fmt.Sprint(100+2*i), 100+2*i, 1, store.DefaultUrgency, time.Time{})
		e.acceptAt(t, b, "minted-"+fmt.Sprint(101+2*i), 101+2*i, 1, store.DefaultUrgency, time.Time{})
		if i == 10 {
			e.acceptAt(t, b, "light", 500, 1, store.DefaultUrgency, time.Time{})
		}
		if op := must(b.ClaimNext("w1", time.Minute))(t); op != nil && op.Scope == "light" {
			if i > 12 {
				t.Fatalf("the light tenant's operation was claimed %d claims after it came, want within 3", i-10+1)
			}
			return
		}
	}
	t.Fatal("the light tenant's operation was not claimed in 20 claims after it came")
}

// The runner under capacity looks at the next operation, takes a seat in its place, then claims
// it by id: the same order as ClaimNext's, one claim per operation, nothing stale.
func testPeekThenClaim(t *testing.T, e *env) {
	b, other := e.open(), e.open()
	e.acceptAt(t, b, "a", 0, 6, store.DefaultUrgency, time.Time{})
	e.acceptAt(t, b, "b", 6, 2, store.DefaultUrgency, time.Time{})
	e.acceptAt(t, b, "a", 8, 1, store.MostUrgent, time.Time{})
	e.acceptAt(t, b, "c", 9, 2, store.LeastUrgent, time.Time{})
	e.acceptAt(t, b, "d", 11, 1, store.DefaultUrgency, e.clock.Now().Add(-time.Second))
	got := peekThenClaim(t, b, other, 20)
	// a's urgent claim is its turn in the urgent band only: at the default urgency a and b start
	// level, and a's work is older.
	want := []string{opID(8), opID(0), opID(6), opID(1), opID(7), opID(2), opID(3), opID(4), opID(5), opID(9), opID(10)}
	if !slices.Equal(got, want) {
		t.Fatalf("claimed %v,\nwant %v", got, want)
	}
	if stale := must(b.ClaimQueued(opID(11), "w1", time.Minute))(t); stale != nil {
		t.Fatalf("claimed %s past its queue deadline", stale.ID)
	}
}

// peekThenClaim looks at the next operation and claims it by id, as the runner under capacity
// does, until the queue is empty (at most max claims), checking that other cannot claim it
// again; it returns the ids in claim order.
func peekThenClaim(t *testing.T, b, other store.Backend, max int) []string {
	t.Helper()
	var got []string
	for range max {
		next := must(b.NextQueued())(t)
		if next == nil {
			break
		}
		if next.Status != store.StatusQueued {
			t.Fatalf("NextQueued gave %s %s", next.ID, next.Status)
		}
		op := must(b.ClaimQueued(next.ID, "w1", time.Minute))(t)
		if op == nil || op.ID != next.ID || op.Status != store.StatusRunning || op.Holder != "w1" {
			t.Fatalf("claiming %s by id: %+v", next.ID, op)
		}
		if again := must(other.ClaimQueued(next.ID, "w2", time.Minute))(t); again != nil {
			t.Fatalf("%s claimed twice", next.ID)
		}
		got = append(got, op.ID)
	}
	return got
}

// acceptAt stores operations from..from+n-1 of scope, queued at urgency u, with deadline (zero:
// none).
func (e *env) acceptAt(t *testing.T, b store.Backend, scope string, from, n, u int, deadline time.Time) {
	t.Helper()
	for i := from; i < from+n; i++ {
		op := e.newOp(i, scope)
		op.Urgency, op.QueueDeadline = u, deadline
		if _, err := b.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x"}, nil); err != nil {
			t.Fatalf("accept %s: %v", opID(i), err)
		}
	}
}

// drain claims until the queue is empty (at most max claims) and returns the ids in claim order.
func drain(t *testing.T, b store.Backend, max int) []string {
	t.Helper()
	var got []string
	for range max {
		op := must(b.ClaimNext("w1", time.Minute))(t)
		if op == nil {
			break
		}
		got = append(got, op.ID)
	}
	return got
}

// Tenant a queues 20, then tenant b 2: b's are claimed second and fourth, not after a's 20.
func testScopesTakeTurns(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "a", 0, 20, store.DefaultUrgency, time.Time{})
	e.acceptAt(t, b, "b", 20, 2, store.DefaultUrgency, time.Time{})
	expectDrain(t, b, opIDs([]int{0, 20, 1, 21}, 2, 20))
}

// An urgency-0 operation queued after ten urgency-7 ones is claimed first.
func testUrgentFirst(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "s", 0, 10, store.LeastUrgent, time.Time{})
	e.acceptAt(t, b, "s", 10, 1, store.MostUrgent, time.Time{})
	got := drain(t, b, 20)
	want := []string{opID(10)}
	for i := range 10 {
		want = append(want, opID(i))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("claimed %v,\nwant %v", got, want)
	}
}

// A u=7 operation gains a level per store.AgingStep waited, up to the default urgency: after
// two steps it still yields to newer u=3 work; after ten it ties with u=3 work and goes first
// only by its scope's turn, and it never overtakes u=2. Scope c is served first, so that its
// later claim, of a lane with a turn, leaves the newcomers' turn as b's first claim set it, and
// a, never served, waits in the newcomers' turn (store.NewcomersTurn).
func testAging(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "c", 4, 1, store.DefaultUrgency-1, time.Time{})
	if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.ID != opID(4) {
		t.Fatalf("claimed %+v, want %s", op, opID(4))
	}
	e.acceptAt(t, b, "a", 0, 1, store.LeastUrgent, time.Time{})
	e.clock.Advance(2 * store.AgingStep)
	e.acceptAt(t, b, "b", 1, 1, store.DefaultUrgency, time.Time{})
	if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.ID != opID(1) {
		t.Fatalf("after two steps claimed %+v, want %s (u=3 before u=7 at 5)", op, opID(1))
	}
	e.clock.Advance(8 * store.AgingStep)
	e.acceptAt(t, b, "b", 2, 1, store.DefaultUrgency, time.Time{})
	e.acceptAt(t, b, "c", 3, 1, store.DefaultUrgency-1, time.Time{})
	if got := drain(t, b, 4); !slices.Equal(got, []string{opID(3), opID(0), opID(2)}) {
		t.Fatalf("after ten steps claimed %v, want u=2 first, then the aged u=7 (its scope's turn) before u=3", got)
	}
}

// An operation past its queue deadline is never claimed; StaleQueued finds it, and it fails
// QUEUE_TIMEOUT straight from queued, with its event. Failing from queued with any other code
// is refused.
func testStaleQueued(t *testing.T, e *env) {
	b := e.open()
	b.SetAnnouncer(e.announcer())
	e.acceptAt(t, b, "s", 0, 1, store.MostUrgent, e.clock.Now().Add(10*time.Second))
	e.acceptAt(t, b, "s", 1, 1, store.LeastUrgent, time.Time{})
	if stale := must(b.StaleQueued(e.clock.Now(), 10))(t); len(stale) != 0 {
		t.Fatalf("before its deadline: stale %v", ids(stale))
	}
	e.clock.Advance(11 * time.Second)
	if stale := must(b.StaleQueued(e.clock.Now(), 10))(t); !slices.Equal(ids(stale), []string{opID(0)}) {
		t.Fatalf("stale %v, want [%s]", ids(stale), opID(0))
	}
	if got := drain(t, b, 3); !slices.Equal(got, []string{opID(1)}) {
		t.Fatalf("claimed %v, want only the operation without a deadline", got)
	}
	other := &store.OperationError{Code: "UPSTREAM_ERROR", Message: "x", Retryable: true}
	if _, err := b.Transition(opID(0), store.Change{To: store.StatusFailed, Error: other}); !errors.Is(err, store.ErrIllegalTransition) {
		t.Fatalf("queued -> failed UPSTREAM_ERROR: %v, want ErrIllegalTransition", err)
	}
	timeout := &store.OperationError{Code: store.QueueTimeoutCode, Message: "waited past its deadline", Retryable: true}
	op := must(b.Transition(opID(0), store.Change{To: store.StatusFailed, Error: timeout}))(t)
	if op.Status != store.StatusFailed || op.Error.Code != store.QueueTimeoutCode || op.Attempts != 0 || op.Version != 2 {
		t.Fatalf("timed out: %+v", op)
	}
	if ev := must(b.GetEvent("evt_" + opID(0)))(t); ev.Type != "operation.failed" || ev.Version != 2 {
		t.Fatalf("event: %+v", ev)
	}
	if stale := must(b.StaleQueued(e.clock.Now(), 10))(t); len(stale) != 0 {
		t.Fatalf("after the timeout: stale %v", ids(stale))
	}
}

// An operation claimed and put back in the queue (takeover, graceful stop) may have reached the
// upstream already: its queue deadline applied to its first wait only, so past it the
// operation is neither stale nor passed over by the claim.
func testRequeuedNotStale(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "s", 0, 1, store.DefaultUrgency, e.clock.Now().Add(10*time.Second))
	if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.ID != opID(0) {
		t.Fatalf("claimed %+v, want %s", op, opID(0))
	}
	if op := must(b.Transition(opID(0), store.Change{To: store.StatusQueued}))(t); !op.QueueDeadline.IsZero() {
		t.Fatalf("requeued with queue deadline %v, want none", op.QueueDeadline)
	}
	e.clock.Advance(11 * time.Second)
	if stale := must(b.StaleQueued(e.clock.Now(), 10))(t); len(stale) != 0 {
		t.Fatalf("requeued past the first deadline: stale %v, want none", ids(stale))
	}
	if got := drain(t, b, 3); !slices.Equal(got, []string{opID(0)}) {
		t.Fatalf("claimed %v, want the requeued operation", got)
	}
}

// QueuePosition of each queued operation is its place in the claim order, here where the turns
// and urgencies decide it exactly; QueuedByUrgency counts by stored urgency.
func testQueuePositions(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "a", 0, 3, store.DefaultUrgency, time.Time{})
	e.acceptAt(t, b, "b", 3, 1, store.DefaultUrgency, time.Time{})
	e.acceptAt(t, b, "c", 4, 1, store.MostUrgent, time.Time{})
	e.acceptAt(t, b, "c", 5, 1, store.LeastUrgent, time.Time{})
	if n := must(b.QueuedByUrgency())(t); n != [8]int{1, 0, 0, 4, 0, 0, 0, 1} {
		t.Fatalf("queued by urgency %v", n)
	}
	positions := map[string]int{}
	for i := range 6 {
		positions[opID(i)] = must(b.QueuePosition(opID(i)))(t)
	}
	got := drain(t, b, 10)
	if want := []string{opID(4), opID(0), opID(3), opID(1), opID(2), opID(5)}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
	for i, id := range got {
		if positions[id] != i {
			t.Errorf("%s: position %d, claimed %d-th", id, positions[id], i)
		}
	}
	if _, err := b.QueuePosition(opID(0)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("position of a running operation: %v, want ErrNotFound", err)
	}
	if n := must(b.QueuedByUrgency())(t); n != [8]int{} {
		t.Fatalf("queued by urgency after the drain %v", n)
	}
}

// With newcomers waiting beside a backlog, each queued operation's position is within one of its
// place in the claim order: the newcomers take one turn between them, oldest first
// (store.EstimatePosition). Counted a turn each, the last newcomer was told 6 when 11 went first.
func testQueuePositionsWithNewcomers(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "batch", 0, 10, store.DefaultUrgency, time.Time{})
	e.clock.Advance(time.Millisecond)
	must(b.ClaimNext("w1", time.Minute))(t) // the backlog's lane has a turn from now on
	var ids []string
	for i := range 6 {
		e.clock.Advance(time.Millisecond)
		e.acceptAt(t, b, fmt.Sprint("new-", i), 100+i, 1, store.DefaultUrgency, time.Time{})
	}
	for i := 1; i < 10; i++ {
		ids = append(ids, opID(i))
	}
	for i := range 6 {
		ids = append(ids, opID(100+i))
	}
	positions := map[string]int{}
	for _, id := range ids {
		positions[id] = must(b.QueuePosition(id))(t)
	}
	e.clock.Advance(time.Millisecond)
	for i, id := range drain(t, b, 20) {
		if d := positions[id] - i; d < -1 || d > 1 {
			t.Errorf("%s: position %d, claimed %d-th", id, positions[id], i)
		}
	}
}

// A lane seen for the first time starts at the virtual time, the start of the latest claim
// (store.LaneStart): a new scope's operation goes before the third claim of a lane claimed twice,
// not after all its work, nor before its second.
func testKnownLaneTurnIsTheClaimsTime(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "a", 0, 3, store.DefaultUrgency, time.Time{})
	if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.ID != opID(0) {
		t.Fatalf("claimed %+v, want %s", op, opID(0))
	}
	e.clock.Advance(time.Millisecond)
	if op := must(b.ClaimNext("w1", time.Minute))(t); op == nil || op.ID != opID(1) {
		t.Fatalf("claimed %+v, want %s", op, opID(1))
	}
	e.clock.Advance(time.Microsecond)
	e.acceptAt(t, b, "n", 3, 1, store.DefaultUrgency, time.Time{})
	expectDrain(t, b, opIDs([]int{3, 2}, 0, 0))
}

// The position of another lane's operation is the same however often it is asked: a lane with a
// turn is its own (store.LaneStart), whichever of its operations is met first.
func testPositionOfAKnownLaneIsStable(t *testing.T, e *env) {
	b := e.open()
	e.acceptAt(t, b, "l", 0, 1, store.DefaultUrgency, time.Time{})
	must(b.ClaimNext("w1", time.Minute))(t)
	if _, err := b.Transition(opID(0), store.Change{To: store.StatusSucceeded, Holder: "w1"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Millisecond)
	e.acceptAt(t, b, "b", 10, 5, store.DefaultUrgency, time.Time{})
	e.clock.Advance(time.Millisecond)
	e.acceptAt(t, b, "l", 100, 1, store.DefaultUrgency, time.Time{}) // before b's turn
	e.clock.Advance(time.Millisecond)
	must(b.ClaimQueued(opID(10), "w1", time.Minute))(t) // b's turn: now
	e.clock.Advance(time.Millisecond)
	for i := 101; i < 140; i++ {
		e.acceptAt(t, b, "l", i, 1, store.DefaultUrgency, time.Time{}) // after b's turn
	}
	want := must(b.QueuePosition(opID(11)))(t)
	for range 100 {
		if got := must(b.QueuePosition(opID(11)))(t); got != want {
			t.Fatalf("position %d, then %d", want, got)
		}
	}
	if want != 1 {
		t.Fatalf("position %d, want 1: l's oldest work came before b's turn", want)
	}
}

// Workers on two handles drain work of several scopes and urgencies: each operation is claimed
// exactly once.
func testOrderedClaimsAreExclusive(t *testing.T, e *env) {
	handles := []store.Backend{e.open(), e.open()}
	const perScope, scopes, workers = 10, 4, 8
	for s := range scopes {
		for i := range perScope {
			e.acceptAt(t, handles[0], fmt.Sprintf("s%d", s), s*perScope+i, 1, i%8, time.Time{})
		}
	}
	drainExclusively(t, handles, workers, perScope*scopes)
}

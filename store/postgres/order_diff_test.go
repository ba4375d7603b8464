package postgres

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

// The capacity order is one order (docs/backends.md, "The capacity order"), kept by two pieces of
// code, Badger's in memory and PostgreSQL's in SQL: random scripts of accepts (lanes with and
// without fairness keys, weights, urgencies 0..7, lifts), clock steps that age the work, claims,
// claims by id of any operation, looks then claims by id, and runs that end (succeeded, or
// requeued: their lanes' turns are corrected to the slot time they took) give the same claims,
// in the same order, on both. The behaviour
// suite checks chosen cases; this checks those nobody thought of (it found a claim by id that
// counted a weighted lane's turn from newer work, on PostgreSQL only).
func TestClaimOrderIsTheSameOnBothBackends(t *testing.T) {
	clock := storetest.NewClock()
	pg := openTest(t, pgtest.Database(t), Options{Now: clock.Now})
	bd, err := badger.Open(badger.Options{Dir: t.TempDir(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bd.Close() })
	n := 0
	for seed := range uint64(60) {
		r := rand.New(rand.NewPCG(seed, 7))
		var script []string // what was done, for the failure message
		var accepted, running []string
		do := func(what string, act func(b store.Backend) string) {
			got := [2]string{act(pg), act(bd)}
			if got[0] != got[1] {
				t.Fatalf("seed %d, after %v, %s: PostgreSQL %s, Badger %s", seed, script, what, got[0], got[1])
			}
			script = append(script, what+" "+got[0])
			if id := got[0]; strings.HasPrefix(what, "claim") || strings.HasPrefix(what, "look") {
				if id != "none" {
					running = append(running, id)
				}
			}
		}
		for range 40 {
			switch k := r.IntN(12); {
			case k >= 10 && len(running) > 0: // a run ends, after the time since its claim: its lane's turn is corrected to it
				i := r.IntN(len(running))
				id := running[i]
				running = append(running[:i], running[i+1:]...)
				to := store.StatusSucceeded
				if k == 11 {
					to = store.StatusQueued // taken over: it ran until now, and waits again
				}
				do("end "+id+" "+string(to), func(b store.Backend) string {
					op, err := b.Transition(id, store.Change{To: to, Holder: "w1"})
					if err != nil {
						t.Fatal(err)
					}
					return string(op.Status)
				})
			case k < 5:
				lane := fmt.Sprintf("s%d-%d", seed, r.IntN(3))
				if r.IntN(3) == 0 { // a fresh lane: a newcomer, whose runs correct its band's newcomers' turn
					lane = fmt.Sprintf("f%d-%d", seed, n)
				}
				op := store.Operation{ID: fmt.Sprintf("op_%08d", n), Scope: lane, Status: store.StatusQueued, Version: 1,
					Method: "POST", Path: "/v1/x", SubmittedAt: clock.Now(), Retention: time.Hour,
					Urgency: r.IntN(8), Lift: r.IntN(4)}
				if r.IntN(3) == 0 {
					op.FairKey, op.Weight = "key:"+lane, []float64{2, 1.5, 1.2}[r.IntN(3)] // 1.2 is no float32
				}
				n++
				accepted = append(accepted, op.ID)
				do("accept", func(b store.Backend) string {
					op := op
					if _, err := b.AcceptOperation(&op, &store.Request{Method: "POST", URL: "/v1/x"}, nil); err != nil {
						t.Fatal(err)
					}
					return fmt.Sprintf("%s %s u=%d lift=%d w=%v", op.ID, op.Lane(), op.Urgency, op.Lift, op.Weight)
				})
			case k < 7:
				d := time.Duration(r.IntN(40)) * time.Second
				clock.Advance(d)
				script = append(script, "wait "+d.String())
			case k < 8:
				do("claim", func(b store.Backend) string { return idOf(must(b.ClaimNext("w1", time.Hour))(t)) })
			case k < 9 && len(accepted) > 0: // any queued operation may be claimed by id, first or not
				id := accepted[r.IntN(len(accepted))]
				do("claim by id "+id, func(b store.Backend) string { return idOf(must(b.ClaimQueued(id, "w1", time.Hour))(t)) })
			default:
				do("look, claim by id", func(b store.Backend) string {
					next := must(b.NextQueued())(t)
					if next == nil {
						return "none"
					}
					return idOf(must(b.ClaimQueued(next.ID, "w1", time.Hour))(t))
				})
			}
		}
		for range 100 {
			do("drain", func(b store.Backend) string { return idOf(must(b.ClaimNext("w1", time.Hour))(t)) })
			if script[len(script)-1] == "drain none" {
				break
			}
		}
	}
}

// idOf is op's id, or "none".
func idOf(op *store.Operation) string {
	if op == nil {
		return "none"
	}
	return op.ID
}

// must is v, failing t on err.
func must(v *store.Operation, err error) func(t *testing.T) *store.Operation {
	return func(t *testing.T) *store.Operation {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

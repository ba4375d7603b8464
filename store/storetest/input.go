package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

var inputTests = []test{
	{"IDsWithOddBytesAreNotFound", testOddIDs},
	{"CursorsWithOddBytesPageAsTheirBytesSay", testOddCursors},
}

// oddIDs come from URLs (%00, %ff): no operation or event has them, and asking for one is an
// answer (not found), never a storage failure.
var oddIDs = []string{"op_\x00", "op_\xff", "\xc3(", "op_000000\x00", "evt_op_000000\xfe"}

func testOddIDs(t *testing.T, e *env) {
	b := e.open()
	b.SetAnnouncer(e.announcer())
	e.event(t, b, 0)
	e.accept(t, b, "s", 1, 1)
	must(b.ClaimNext("w1", time.Minute))(t)
	for _, id := range oddIDs {
		notFound := map[string]error{}
		_, notFound["GetOperation"] = b.GetOperation(id)
		_, notFound["LoadRequest"] = b.LoadRequest(id)
		_, notFound["LoadResult"] = b.LoadResult(id)
		_, notFound["Transition"] = b.Transition(id, store.Change{To: store.StatusCanceled})
		_, notFound["RequestCancel"] = b.RequestCancel(id, e.clock.Now())
		_, notFound["RecordAttempt"] = b.RecordAttempt(id)
		_, notFound["GetEvent"] = b.GetEvent(id)
		_, notFound["Redeliver"] = b.Redeliver(id, e.clock.Now())
		_, notFound["ClaimEvent"] = b.ClaimEvent(id, "w1", time.Minute)
		notFound["MarkDelivered"] = b.MarkDelivered(id, store.Attempt{Attempts: 1, At: e.clock.Now(), Status: 200})
		for call, err := range notFound {
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("%s(%q): %v, want ErrNotFound", call, id, err)
			}
		}
		r, err := b.RenewLeases("w1", []string{opID(1), id}, time.Minute)
		if err != nil || !slices.Equal(r.Lost, []string{id}) {
			t.Errorf("RenewLeases with %q: %+v %v, want it lost and %s renewed", id, r, err, opID(1))
		}
		if st, err := b.GetEndpointState(id); err != nil || st.Disabled {
			t.Errorf("GetEndpointState(%q): %+v %v, want the zero state", id, st, err)
		}
		if n, err := b.RescheduleEndpoint(id, e.clock.Now()); err != nil || n != 0 {
			t.Errorf("RescheduleEndpoint(%q): %d %v, want 0", id, n, err)
		}
	}
}

// An `after` cursor is compared byte-wise with the ids, whatever bytes it holds.
func testOddCursors(t *testing.T, e *env) {
	b := e.open()
	b.SetAnnouncer(e.announcer())
	for i := range 3 {
		e.event(t, b, i)
		ok(t, b.DeadLetter("evt_"+opID(i), "max_attempts", store.Attempt{Attempts: 1, At: e.clock.Now()}))
	}
	for _, tc := range []struct {
		after string
		list  []string // ListOperations and ListAllOperations, newest first
		dead  []string // DeadLetters, oldest first
	}{
		{"op_000001\xff", []string{opID(1), opID(0)}, []string{}},
		{"op_\x00", []string{}, []string{}},
		{"\xff", []string{opID(2), opID(1), opID(0)}, []string{}},
		{"evt_\x00", []string{}, []string{"evt_" + opID(0), "evt_" + opID(1), "evt_" + opID(2)}},
		{"evt_op_000001\x00", []string{}, []string{"evt_" + opID(2)}},
		{"evt_op_000000\xc3(", []string{}, []string{"evt_" + opID(1), "evt_" + opID(2)}},
		{"op_000002\xf4\x90", []string{opID(2), opID(1), opID(0)}, []string{}},
		{"\x00", []string{}, []string{"evt_" + opID(0), "evt_" + opID(1), "evt_" + opID(2)}},
	} {
		page, _, err := b.ListOperations("s", "", tc.after, 10)
		if err != nil || !slices.Equal(ids(page), tc.list) {
			t.Errorf("ListOperations after %q: %v %v, want %v", tc.after, ids(page), err, tc.list)
		}
		all, _, err := b.ListAllOperations("", tc.after, 10)
		if err != nil || !slices.Equal(ids(all), tc.list) {
			t.Errorf("ListAllOperations after %q: %v %v, want %v", tc.after, ids(all), err, tc.list)
		}
		dead, err := b.DeadLetters(tc.after, 10)
		got := []string{}
		for _, ev := range dead {
			got = append(got, ev.ID)
		}
		if err != nil || !slices.Equal(got, tc.dead) {
			t.Errorf("DeadLetters after %q: %v %v, want %v", tc.after, got, err, tc.dead)
		}
	}
}

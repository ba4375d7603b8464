package storetest

import (
	"errors"
	"math"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

var inputTests = []test{
	{"IDsWithOddBytesAreNotFound", testOddIDs},
	{"CursorsWithOddBytesPageAsTheirBytesSay", testOddCursors},
	{"HeaderBytesAreKeptExactly", testHeaderBytes},
	{"LimitsOfNothingOrEverything", testOddLimits},
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

// oddHeader has values that are not UTF-8 (obs-text, RFC 9110 §5.5), as upstreams and clients
// may send them.
var oddHeader = http.Header{"Content-Disposition": {"attachment; filename=\"caf\xe9.txt\""}, "X-Bytes": {"\xff\xfe", "plain"}}

// A replay, a stored request and a stored result keep header bytes exactly.
func testHeaderBytes(t *testing.T, e *env) {
	a, b := e.open(), e.open()
	c := must(a.ClaimKey(keyA, fpA, time.Minute))(t)
	ok(t, a.CompleteKey(keyA, c.Token, store.Response{Status: 200, Header: oddHeader, Body: []byte("x")}, e.clock.Now().Add(time.Hour)))
	if r := must(b.ClaimKey(keyA, fpA, time.Minute))(t); r.Outcome != store.Replay || !reflect.DeepEqual(r.Record.Response.Header, oddHeader) {
		t.Errorf("replayed header %q, want %q", r.Record.Response.Header, oddHeader)
	}
	must(a.AcceptOperation(e.newOp(0, "s"), &store.Request{Method: "POST", URL: "/v1/x", Header: oddHeader}, nil))(t)
	if req := must(b.LoadRequest(opID(0)))(t); !reflect.DeepEqual(req.Header, oddHeader) {
		t.Errorf("stored request header %q, want %q", req.Header, oddHeader)
	}
	must(a.ClaimNext("w1", time.Minute))(t)
	must(a.Transition(opID(0), store.Change{To: store.StatusSucceeded, Holder: "w1", Result: &store.Response{Status: 200, Header: oddHeader}}))(t)
	if res := must(b.LoadResult(opID(0)))(t); !reflect.DeepEqual(res.Header, oddHeader) {
		t.Errorf("stored result header %q, want %q", res.Header, oddHeader)
	}
}

// A limit of 0 or less asks for nothing, and a huge one for everything there is.
func testOddLimits(t *testing.T, e *env) {
	b := e.open()
	b.SetAnnouncer(e.announcer())
	e.event(t, b, 0)
	ok(t, b.DeadLetter("evt_"+opID(0), "max_attempts", store.Attempt{Attempts: 1, At: e.clock.Now()}))
	e.event(t, b, 1)
	e.accept(t, b, "s", 2, 1)
	must(b.ClaimNext("w1", time.Minute))(t)
	e.clock.Advance(2 * time.Minute)
	for _, limit := range []int{0, -1, math.MinInt} {
		if ops, next, err := b.ListOperations("s", "", "", limit); err != nil || len(ops) != 0 || next != "" {
			t.Errorf("ListOperations limit %d: %v %q %v", limit, ids(ops), next, err)
		}
		if ops, _, err := b.ListAllOperations("", "", limit); err != nil || len(ops) != 0 {
			t.Errorf("ListAllOperations limit %d: %v %v", limit, ids(ops), err)
		}
		if evs, err := b.DeadLetters("", limit); err != nil || len(evs) != 0 {
			t.Errorf("DeadLetters limit %d: %d %v", limit, len(evs), err)
		}
		if due, err := b.DueEvents(time.Time{}, e.clock.Now(), limit); err != nil || len(due) != 0 {
			t.Errorf("DueEvents limit %d: %v %v", limit, due, err)
		}
		if exp, err := b.ExpiredLeases(limit); err != nil || len(exp) != 0 {
			t.Errorf("ExpiredLeases limit %d: %v %v", limit, ids(exp), err)
		}
	}
	if ops, next, err := b.ListOperations("s", "", "", math.MaxInt); err != nil || len(ops) != 3 || next != "" {
		t.Errorf("ListOperations limit MaxInt: %v %q %v", ids(ops), next, err)
	}
	if ops, _, err := b.ListAllOperations("", "", math.MaxInt); err != nil || len(ops) != 3 {
		t.Errorf("ListAllOperations limit MaxInt: %v %v", ids(ops), err)
	}
	if evs, err := b.DeadLetters("", math.MaxInt); err != nil || len(evs) != 1 {
		t.Errorf("DeadLetters limit MaxInt: %d %v", len(evs), err)
	}
	if due, err := b.DueEvents(time.Time{}, e.clock.Now(), math.MaxInt); err != nil || len(due) != 1 {
		t.Errorf("DueEvents limit MaxInt: %v %v", due, err)
	}
	if exp, err := b.ExpiredLeases(math.MaxInt); err != nil || len(exp) != 1 {
		t.Errorf("ExpiredLeases limit MaxInt: %v %v", ids(exp), err)
	}
}

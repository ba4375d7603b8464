package module

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// A tenant flooding with Priority: u=0 does not pass another tenant's default call: a caller's
// urgency above the default orders only its own work. A class the operator trusts does.
func TestCapacityForgedUrgencyDoesNotPassAnotherTenant(t *testing.T) {
	g, a := startSlotted(t, 1, 30*time.Millisecond, "capacity {\n limit 1\n class ops {\n header X-Trusted-Tier ops\n urgency 0\n weight 2\n }\n}")
	_, first := g.submit(t, "loud-0", "Authorization", "Bearer loud", "Priority", "u=0", "X-Mock-Latency", "1s")
	loud := []string{first.OperationID}
	testkit.WaitFor(t, 5*time.Second, "the first call at the model server", func() bool { return g.model.Stats().InFlight == 1 })
	for i := 1; i < 10; i++ {
		_, op := g.submit(t, "loud-"+itoa(i), "Authorization", "Bearer loud", "Priority", "u=0")
		loud = append(loud, op.OperationID)
	}
	_, quiet := g.submit(t, "quiet", "Authorization", "Bearer quiet")
	_, trusted := g.submit(t, "trusted", "Authorization", "Bearer ops", "X-Trusted-Tier", "ops")
	if view := decodeOp(t, g.get("/v1/operations/"+loud[1], "Authorization", "Bearer loud")); view.Urgency != 3 {
		t.Fatalf("a forged u=0 waits at urgency %d across tenants; want 3", view.Urgency)
	}
	for _, id := range loud {
		g.await(t, id, "Authorization", "Bearer loud")
	}
	g.await(t, quiet.OperationID, "Authorization", "Bearer quiet")
	g.await(t, trusted.OperationID, "Authorization", "Bearer ops")
	order := a.order()
	if at := slices.Index(order, "trusted"); at < 0 || at > 2 {
		t.Errorf("the trusted class's call reached the model server at %d of %v; want among the first three", at, order)
	}
	if at := slices.Index(order, "quiet"); at < 0 || at > 4 {
		t.Errorf("the quiet tenant's call reached the model server at %d of %v; want within about a turn", at, order)
	}
}

// A tenant's own Priority above the default orders its own operations, in the durable queue and
// waiting for a seat alike: its u=0 operation, sent after four at the default, reaches the model
// server first of them, and still waits at the default urgency across tenants.
func TestCapacityACallersOwnPriorityOrdersItsOwnOperations(t *testing.T) {
	g, a := startSlotted(t, 1, 30*time.Millisecond, "capacity {\n limit 1\n}")
	_, first := g.submit(t, "own-0", "Authorization", "Bearer own", "X-Mock-Latency", "1s")
	testkit.WaitFor(t, 5*time.Second, "the first call at the model server", func() bool { return g.model.Stats().InFlight == 1 })
	ids := []string{first.OperationID}
	for i := 1; i < 5; i++ {
		_, op := g.submit(t, "own-"+itoa(i), "Authorization", "Bearer own")
		ids = append(ids, op.OperationID)
	}
	_, urgent := g.submit(t, "own-urgent", "Authorization", "Bearer own", "Priority", "u=0")
	if view := decodeOp(t, g.get("/v1/operations/"+urgent.OperationID, "Authorization", "Bearer own")); view.Urgency != 3 {
		t.Fatalf("an untrusted u=0 waits at urgency %d across tenants; want 3", view.Urgency)
	}
	for _, id := range append(ids, urgent.OperationID) {
		g.await(t, id, "Authorization", "Bearer own")
	}
	if order := a.order(); slices.Index(order, "own-urgent") != 1 {
		t.Errorf("the tenant's u=0 operation reached the model server at %d of %v; want right after the call holding the seat",
			slices.Index(order, "own-urgent"), order)
	}
}

// Without a capacity block too, a caller's Priority above the default is its word about its own
// work only: the queue takes it across tenants at the default (the operations' scopes taking
// turns), and within the tenant's own work first. It counted across tenants as it came.
func TestWithoutCapacityAnUntrustedPriorityOrdersOnlyItsOwnOperations(t *testing.T) {
	g, a := startSlotted(t, 1, 30*time.Millisecond, "async {\n concurrency 1\n}")
	_, first := g.submit(t, "loud-0", "Authorization", "Bearer loud", "X-Mock-Latency", "1s")
	testkit.WaitFor(t, 5*time.Second, "the first call at the model server", func() bool { return g.model.Stats().InFlight == 1 })
	_, quiet := g.submit(t, "quiet", "Authorization", "Bearer quiet")
	_, loud1 := g.submit(t, "loud-1", "Authorization", "Bearer loud")
	_, urgent := g.submit(t, "loud-urgent", "Authorization", "Bearer loud", "Priority", "u=0")
	if view := decodeOp(t, g.get("/v1/operations/"+urgent.OperationID, "Authorization", "Bearer loud")); view.Urgency != 3 {
		t.Fatalf("an untrusted u=0 waits at urgency %d across tenants; want 3", view.Urgency)
	}
	for _, id := range []string{first.OperationID, loud1.OperationID, urgent.OperationID} {
		g.await(t, id, "Authorization", "Bearer loud")
	}
	g.await(t, quiet.OperationID, "Authorization", "Bearer quiet")
	if order, want := a.order(), []string{"loud-0", "quiet", "loud-urgent", "loud-1"}; !slices.Equal(order, want) {
		t.Errorf("the model server saw %v; want %v", order, want)
	}
}

// The fairness key may be a header the auth layer sets: callers minting a credential per call
// share their tenant's turn instead of getting one each.
func TestCapacityFairKeyFromAHeaderSharesTurnsByTenant(t *testing.T) {
	g, a := startSlotted(t, 1, 30*time.Millisecond, "capacity {\n limit 1\n wait 1m\n fair_key {http.request.header.X-Tenant}\n}")
	pool := func() seatSnapshot { return gatewayPool(t, g).Snapshot() }
	var wg sync.WaitGroup
	call := func(key, credential, tenant string, more ...string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			headers := append([]string{"Authorization", "Bearer " + credential, "X-Tenant", tenant}, more...)
			if r := g.post(chatPath, key, chat(key), headers...); r.err != nil || r.StatusCode != http.StatusOK {
				t.Errorf("%s: %v %s", key, r.err, r.body)
			}
		}()
	}
	call("m-0", "minted-0", "minter", "X-Mock-Latency", "500ms")
	testkit.WaitFor(t, 5*time.Second, "the first call at the model server", func() bool { return g.model.Stats().InFlight == 1 })
	for i := 1; i < 8; i++ {
		call("m-"+itoa(i), "minted-"+itoa(i), "minter")
		testkit.WaitFor(t, 5*time.Second, "the call waiting", func() bool { return sumWaiting(pool()) == i })
	}
	call("h-0", "honest", "honest")
	call("h-1", "honest", "honest")
	testkit.WaitFor(t, 5*time.Second, "every call waiting", func() bool { return sumWaiting(pool()) == 9 })
	wg.Wait()
	// m-0 held the seat and m-1 waited first; then the tenants take turns by the slot time
	// their calls held: the honest calls (in either order, sent at once) third and fifth, or
	// third and fourth when the minter's calls happened to hold their seat a little longer.
	// A turn per credential would put them last.
	order := a.order()
	first, second := slices.Index(order, "h-0"), slices.Index(order, "h-1")
	if min(first, second) != 2 || max(first, second) > 4 {
		t.Errorf("the honest calls reached the model server at %d and %d of %v; want 2, then 3 or 4", first, second, order)
	}
}

func sumWaiting(s seatSnapshot) int {
	n := 0
	for _, w := range s.Waiting {
		n += w
	}
	return n
}

// Hostile Priority and fairness-header values leave the default: never a 500.
func TestCapacityHostileUrgencyAndFairKeyValuesAreServed(t *testing.T) {
	g, _ := startSlotted(t, 2, 5*time.Millisecond, "capacity {\n limit 1\n fair_key {http.request.header.X-Tenant}\n}")
	hostile := []string{"u=-1", "u=99999999999999999999", "u=0;u=1,,", "u=\"0\"", strings.Repeat("u=0,", 2000), "u=3, i=?2", ""}
	var wg sync.WaitGroup
	for i, p := range hostile {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := g.post(chatPath, "", chat("x"), "Priority", p, "X-Tenant", strings.Repeat("t", 10000)+itoa(i))
			if r.err != nil || r.StatusCode != http.StatusOK {
				t.Errorf("Priority %.20q: %v %s", p, r.err, r.body)
			}
		}()
	}
	wg.Wait()
}

func TestCapacityClassesAndFairKeyThatDoNotParseAreLoadErrors(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"capacity {\n fair_key X-Tenant\n}", "fair_key must be a placeholder"},
		{"capacity {\n fair_key {http.request.header.X-Tenant\n}", "fair_key must be a placeholder"},
		{"capacity {\n class gold {\n urgency 1\n }\n}", `class "gold" needs a header field name`},
		{"capacity {\n class gold {\n header X-Tier gold\n urgency 9\n }\n}", "urgency must be from 0 to 7, got 9"},
		{"capacity {\n class gold {\n header X-Tier\n weight 0.5\n }\n}", "weight must be from 1 to 1000"},
		{"capacity {\n class gold {\n header X-Tier\n weight lots\n }\n}", `weight must be a number, got "lots"`},
		{"capacity {\n class gold {\n header X-Tier\n colour red\n }\n}", `unrecognized class subdirective "colour"`},
		{"capacity {\n class {\n }\n}", "class needs a name"},
	} {
		if err := capacityBlockError(tc.block); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.block, err, tc.want)
		}
	}
	var c CapacityConfig
	d := caddyfile.NewTestDispenser("capacity {\n limit 2\n fair_key {http.request.header.X-Tenant}\n class gold {\n header X-Tier gold\n urgency 1\n weight 4\n }\n}")
	d.Next()
	if err := c.unmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if len(c.Classes) != 1 || c.Classes[0].Name != "gold" || c.Classes[0].Header != "X-Tier" || c.Classes[0].Value != "gold" ||
		*c.Classes[0].Urgency != 1 || c.Classes[0].Weight != 4 || c.FairKey != "{http.request.header.X-Tenant}" {
		t.Fatalf("parsed %+v", c)
	}
}

// capacityBlockError is the error a capacity block gets when it is parsed, defaulted and
// validated as a config load does; nil when it loads.
func capacityBlockError(block string) error {
	var c CapacityConfig
	d := caddyfile.NewTestDispenser(block)
	d.Next()
	err := c.unmarshalCaddyfile(d)
	if err == nil {
		c.setDefaults()
		err = c.validate()
	}
	return err
}

// Two tenants' operations wait in the durable queue, one's calls taking 200 ms at the model
// server and the other's 50 ms: they share the seat by the slot time their calls take, so the
// short tenant's operations reach the model server about three to four times as often while
// both have work (15 of 20 calls). With turns counting claims they went one for one (10 of 20),
// and the long tenant held the seat four times as long.
func TestCapacityDurableQueueSharesSlotTimeNotClaims(t *testing.T) {
	g, a := startSlotted(t, 1, 50*time.Millisecond, "capacity {\n limit 1\n}")
	_, first := g.submit(t, "holder", "Authorization", "Bearer holder", "X-Mock-Latency", "500ms")
	testkit.WaitFor(t, 5*time.Second, "the first call at the model server", func() bool { return g.model.Stats().InFlight == 1 })
	ids := map[string][]string{}
	for i := range 12 {
		_, op := g.submit(t, "long-"+itoa(i), "Authorization", "Bearer long", "X-Mock-Latency", "200ms")
		ids["long"] = append(ids["long"], op.OperationID)
	}
	for i := range 30 {
		_, op := g.submit(t, "short-"+itoa(i), "Authorization", "Bearer short")
		ids["short"] = append(ids["short"], op.OperationID)
	}
	g.await(t, first.OperationID, "Authorization", "Bearer holder")
	for tenant, ops := range ids {
		for _, id := range ops {
			g.await(t, id, "Authorization", "Bearer "+tenant)
		}
	}
	order := a.order()
	// The first 20 calls after the holder's, while both tenants still have work: the short
	// tenant's first costs it a second (nothing measured yet), and later ones their time.
	short := 0
	for _, key := range order[1:21] {
		if strings.HasPrefix(key, "short-") {
			short++
		}
	}
	t.Logf("the short tenant took %d of the 20 calls after the holder's: %v", short, order[1:21])
	if short < 13 {
		t.Errorf("the short tenant's calls took %d of the 20 calls after the holder's (%v); want about four in five", short, order[1:21])
	}
}

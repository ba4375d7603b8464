package capacity

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClassMatchesItsHeaderAndSetsTrustedUrgencyAndWeight(t *testing.T) {
	one := 1
	c := Class{Name: "ops", Header: "x-trusted-tier", Value: "ops", Urgency: &one, Weight: 4}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	if c.Matches(h) {
		t.Error("matched without the header")
	}
	h.Set("X-Trusted-Tier", "batch")
	if c.Matches(h) {
		t.Error("matched another value")
	}
	h.Set("X-Trusted-Tier", "ops")
	if !c.Matches(h) {
		t.Error("did not match its value")
	}
	a := c.Apply(Ask{Urgency: 7, Key: "k"})
	if a.Urgency != 1 || !a.Trusted || a.Weight != 4 || a.Key != "k" || a.Stored() != 1 {
		t.Errorf("applied: %+v, stored at %d", a, a.Stored())
	}
	if u := (Ask{Urgency: 0}).Stored(); u != 3 {
		t.Errorf("an untrusted u=0 is stored at %d, want the default 3", u)
	}
	if u := (Ask{Urgency: 6}).Stored(); u != 6 {
		t.Errorf("an untrusted u=6 is stored at %d, want 6", u)
	}
	any := Class{Name: "any", Header: "X-Tier", Value: "*"}
	if !any.Matches(http.Header{"X-Tier": {""}}) {
		t.Error(`"*" did not match an empty value`)
	}
}

func TestClassesAndFairKeysThatDoNotParseAreRefused(t *testing.T) {
	nine := 9
	for _, c := range []Class{
		{Header: "X"},
		{Name: "a"},
		{Name: "a", Header: "X Tier"},
		{Name: "a", Header: "{http.request.header.X}"},
		{Name: "a", Header: "X", Urgency: &nine},
		{Name: "a", Header: "X", Weight: 0.5},
		{Name: "a", Header: "X", Weight: MaxClassWeight + 1},
		{Name: "a", Header: "X", Weight: math.NaN()}, // "NaN" parses as a number
		{Name: "a", Header: "X", Weight: math.Inf(1)},
	} {
		if c.Validate() == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
	for _, k := range []string{"tenant", "{a", "a}", "}{", "{a}}"} {
		if ValidateFairKey(k) == nil {
			t.Errorf("fair_key %q: accepted", k)
		}
	}
	for _, k := range []string{"", "{http.request.header.X-Tenant}", "t-{a}-{b}"} {
		if err := ValidateFairKey(k); err != nil {
			t.Errorf("fair_key %q: %v", k, err)
		}
	}
	if FairKey("") != "" || FairKey("acme") != "key:acme" || len(FairKey(strings.Repeat("x", 10_000))) != len("key:")+maxFairKey {
		t.Error("fair keys are not kept apart from scopes, or not bounded")
	}
	for _, k := range []string{"a\xffb", "\x00", "t\x00x", strings.Repeat("é", 200), "x" + strings.Repeat("€", 100)} {
		got := FairKey(k)
		if !utf8.ValidString(got) || strings.ContainsRune(got, 0) || len(got) > len("key:")+maxFairKey {
			t.Errorf("FairKey(%q) = %q: not text a storage keeps, or not bounded", k, got)
		}
	}
	if FairKey("\x00") != "" {
		t.Error("a key of NUL alone is not the scope")
	}
}

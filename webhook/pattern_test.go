package webhook

import (
	"strings"
	"testing"
)

func TestPatternMatchesTheCallbacksItStandsFor(t *testing.T) {
	p, err := ParsePattern("https://hooks.example/in/*/done")
	if err != nil || !p.Wildcard() {
		t.Fatalf("ParsePattern: %v, wildcard %v", err, p != nil && p.Wildcard())
	}
	for raw, want := range map[string]bool{
		"https://hooks.example/in/a/done":      true,
		"https://HOOKS.example/in/a/b/done":    true,
		"http://hooks.example/in/a/done":       false, // scheme
		"https://hooks.example:8443/in/a/done": false, // host and port
		"https://hooks.example/in/a/../done":   false, // dot segments are refused, not resolved
		"https://hooks.example//in/a/done":     false,
		"https://hooks.example/in/a/done/more": false,
	} {
		u, ok := ParseCallback(raw)
		if !ok {
			t.Fatalf("ParseCallback(%q) refused", raw)
		}
		if got := p.Matches(u); got != want {
			t.Errorf("%s matches %s: %v, want %v", p, raw, got, want)
		}
	}
}

func TestPatternsAndCallbacksThatAreRefused(t *testing.T) {
	for _, raw := range []string{"ftp://hooks.example/x", "/relative", "https://u:p@hooks.example/x", "https://*.example/x"} {
		if _, err := ParsePattern(raw); err == nil || !strings.Contains(err.Error(), "must be an absolute http(s) URL") {
			t.Errorf("ParsePattern(%q) = %v, want refused", raw, err)
		}
	}
	for _, raw := range []string{"ftp://hooks.example/x", "https://u@hooks.example/x", "https://hooks.example/x#f", "::"} {
		if _, ok := ParseCallback(raw); ok {
			t.Errorf("ParseCallback(%q) accepted", raw)
		}
	}
}

func TestParseSecretsSplitsEntriesAndKeepsXWebhookSecretsAsWritten(t *testing.T) {
	if s, err := ParseSecrets(XWebhook, []string{"one two", "three"}); err != nil || len(s) != 3 {
		t.Fatalf("x-webhook secrets: %d, %v; want 3", len(s), err)
	}
	if _, err := ParseSecrets(StandardWebhooks, []string{"not-a-whsec"}); err == nil {
		t.Fatal("a Standard Webhooks secret without whsec_ was accepted")
	}
}

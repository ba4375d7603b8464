package courier

import (
	"testing"
	"time"
)

// settings are valid delivery settings around endpoints.
func settings(def string, endpoints ...EndpointSettings) Settings {
	return Settings{Endpoints: endpoints, Default: def, Events: []string{"operation.succeeded"},
		Timeout: 15 * time.Second, MaxAttempts: 8, MaxAge: 72 * time.Hour, BreakerFailures: 5, BreakerCooldown: 30 * time.Second}
}

func known(e string) bool { return e == "operation.succeeded" }

func TestCallbackUrlsMatchEndpointPatterns(t *testing.T) {
	h, err := NewSetup(settings("",
		EndpointSettings{Name: "a", URL: "https://consumer.example.com/webhooks/*", Secrets: []string{testSecret}},
		EndpointSettings{Name: "b", URL: "https://b.example.com/hook", Secrets: []string{testSecret}}), known)
	if err != nil {
		t.Fatal(err)
	}
	for url, want := range map[string]string{
		"https://consumer.example.com/webhooks/ai-jobs":      "a",
		"https://CONSUMER.example.com/webhooks/x/y?tenant=1": "a",
		"https://b.example.com/hook":                         "b",
		"https://b.example.com/hook/more":                    "",
		"http://consumer.example.com/webhooks/x":             "", // scheme differs
		"https://consumer.example.com/webhooks/../admin":     "",
		"https://consumer.example.com//webhooks/x":           "",
		"https://user:pw@consumer.example.com/webhooks/x":    "",
		"https://consumer.example.com.evil.io/webhooks/x":    "",
		"ftp://consumer.example.com/webhooks/x":              "",
	} {
		ep, _, ok := h.CallbackFor(url)
		got := ""
		if ok && ep != nil {
			got = ep.Name
		}
		if got != want {
			t.Errorf("%s: matched %q, want %q", url, got, want)
		}
	}
	if ep, target, ok := h.CallbackFor(""); !ok || ep != nil || target != "" {
		t.Errorf("no Callback-Url and no default: %v %q %v", ep, target, ok)
	}
}

func TestWebhookSettingsMistakesAreRefused(t *testing.T) {
	ep := func(name, url, secret string) EndpointSettings {
		return EndpointSettings{Name: name, URL: url, Secrets: []string{secret}}
	}
	backoff := settings("")
	backoff.BackoffMin = time.Minute
	attempts := settings("")
	attempts.MaxAttempts = 0
	events := settings("")
	events.Events = []string{"operation.exploded"}
	for name, s := range map[string]Settings{
		"wildcard default":        settings("a", ep("a", "https://x.example.com/*", testSecret)),
		"unknown default":         settings("zz", ep("a", "https://x.example.com/", testSecret)),
		"bad secret":              settings("", ep("a", "https://x.example.com/", "whsec_!!!")),
		"no secret":               settings("", ep("a", "https://x.example.com/", "")),
		"duplicate":               settings("", ep("a", "https://x.example.com/", testSecret), ep("a", "https://y.example.com/", testSecret)),
		"not http":                settings("", ep("a", "ftp://x.example.com/", testSecret)),
		"no name":                 settings("", ep("", "https://x.example.com/", testSecret)),
		"backoff without its max": backoff,
		"no attempts":             attempts,
		"unknown event type":      events,
	} {
		if _, err := NewSetup(s, known); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

package module

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
)

func TestCallbackUrlsMatchEndpointPatterns(t *testing.T) {
	cfg := &WebhooksConfig{Endpoints: []EndpointConfig{
		{Name: "a", URL: "https://consumer.example.com/webhooks/*", Secrets: []string{secretA}},
		{Name: "b", URL: "https://b.example.com/hook", Secrets: []string{secretA}},
	}}
	cfg.setDefaults()
	h, err := newWebhookSetup(cfg, caddy.NewReplacer())
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
		ep, _, ok := h.callbackFor(url)
		got := ""
		if ok && ep != nil {
			got = ep.name
		}
		if got != want {
			t.Errorf("%s: matched %q, want %q", url, got, want)
		}
	}
}

func TestWebhookConfigMistakesAreRefused(t *testing.T) {
	for name, cfg := range map[string]WebhooksConfig{
		"wildcard default":   {Default: "a", Endpoints: []EndpointConfig{{Name: "a", URL: "https://x.example.com/*", Secrets: []string{secretA}}}},
		"unknown default":    {Default: "zz", Endpoints: []EndpointConfig{{Name: "a", URL: "https://x.example.com/", Secrets: []string{secretA}}}},
		"bad secret":         {Endpoints: []EndpointConfig{{Name: "a", URL: "https://x.example.com/", Secrets: []string{"whsec_!!!"}}}},
		"no secret":          {Endpoints: []EndpointConfig{{Name: "a", URL: "https://x.example.com/", Secrets: []string{""}}}},
		"duplicate":          {Endpoints: []EndpointConfig{{Name: "a", URL: "https://x.example.com/", Secrets: []string{secretA}}, {Name: "a", URL: "https://y.example.com/", Secrets: []string{secretA}}}},
		"not http":           {Endpoints: []EndpointConfig{{Name: "a", URL: "ftp://x.example.com/", Secrets: []string{secretA}}}},
		"unknown event type": {Events: []string{"operation.exploded"}},
	} {
		cfg.setDefaults()
		if _, err := newWebhookSetup(&cfg, caddy.NewReplacer()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

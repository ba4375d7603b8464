package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/webhook"
)

func mustRawSecret(t testing.TB, s string) webhook.Secret {
	t.Helper()
	secret, err := webhook.RawSecret(s)
	if err != nil {
		t.Fatalf("RawSecret(%q): %v", s, err)
	}
	return secret
}

// xSignedHeaders returns the X-Webhook headers of one attempt of testMessage.
func xSignedHeaders(secrets []webhook.Secret, ts time.Time) http.Header {
	h := http.Header{}
	h.Set(webhook.HeaderXID, testMessage.ID)
	h.Set(webhook.HeaderXTimestamp, ts.UTC().Format(time.RFC3339))
	h.Set(webhook.HeaderXSignature, webhook.SignXWebhook(secrets, ts, testMessage.Body))
	return h
}

var xSignature = regexp.MustCompile(`^t=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ(,v1=[0-9a-f]{64})+$`)

func TestXWebhookSignatureVerifies(t *testing.T) {
	secrets := []webhook.Secret{mustRawSecret(t, "seed-secret")}
	h := xSignedHeaders(secrets, signedAt)

	sig := h.Get(webhook.HeaderXSignature)
	if !xSignature.MatchString(sig) || strings.Count(sig, "v1=") != 1 {
		t.Fatalf("X-Webhook-Signature %q, want t=<RFC 3339 UTC>,v1=<64 hex>", sig)
	}
	if want := "t=" + h.Get(webhook.HeaderXTimestamp) + ","; !strings.HasPrefix(sig, want) {
		t.Fatalf("X-Webhook-Signature %q does not start with %q", sig, want)
	}
	if err := webhook.VerifyXWebhook(secrets, h, testMessage.Body, signedAt); err != nil {
		t.Fatalf("VerifyXWebhook = %v, want nil", err)
	}
}

// TestXWebhookSignatureIsTheSeedsHMAC pins the signed content: hex HMAC-SHA256 of "<t>.<body>"
// keyed with the secret's own bytes (computed independently with Python's hmac module).
func TestXWebhookSignatureIsTheSeedsHMAC(t *testing.T) {
	got := webhook.SignXWebhook([]webhook.Secret{mustRawSecret(t, "s3cret")}, time.Unix(0, 0), []byte(`{}`))
	// python3 -c 'import hmac,hashlib;print(hmac.new(b"s3cret",b"1970-01-01T00:00:00Z.{}",hashlib.sha256).hexdigest())'
	want := "t=1970-01-01T00:00:00Z,v1=cc21c584b2c5e4fe08cf522c2546cdf3e8b4b85eca3b27a19a7a6499707340ee"
	if got != want {
		t.Fatalf("SignXWebhook = %q, want %q", got, want)
	}
}

func TestXWebhookRotationSignsWithEverySecretAndEitherVerifies(t *testing.T) {
	current, old := mustRawSecret(t, "current-secret"), mustRawSecret(t, "old-secret")
	h := xSignedHeaders([]webhook.Secret{current, old}, signedAt)

	if n := strings.Count(h.Get(webhook.HeaderXSignature), "v1="); n != 2 {
		t.Fatalf("X-Webhook-Signature %q has %d v1=, want 2", h.Get(webhook.HeaderXSignature), n)
	}
	for name, verifier := range map[string][]webhook.Secret{
		"current only":       {current},
		"old only":           {old},
		"other then current": {mustRawSecret(t, "other"), current},
	} {
		if err := webhook.VerifyXWebhook(verifier, h, testMessage.Body, signedAt); err != nil {
			t.Errorf("verifier with %s: VerifyXWebhook = %v, want nil", name, err)
		}
	}
}

func TestVerifyXWebhookRejectsForgedOrReplayedDeliveries(t *testing.T) {
	secrets := []webhook.Secret{mustRawSecret(t, "seed-secret")}
	tests := []struct {
		name    string
		secrets []webhook.Secret
		edit    func(h http.Header) []byte // returns the body to verify
		now     time.Time
		want    error
	}{
		{"tampered body", secrets, func(http.Header) []byte {
			return []byte(`{"event_id":"evt_01JXYZTEST","event_type":"operation.failed"}`)
		}, signedAt, webhook.ErrNoMatchingSignature},
		{"other secret", []webhook.Secret{mustRawSecret(t, "other")}, nil, signedAt, webhook.ErrNoMatchingSignature},
		{"the secret base64-decoded is not the key", []webhook.Secret{mustSecret(t, currentSecretText)}, nil, signedAt, webhook.ErrNoMatchingSignature},
		{"missing id", secrets, func(h http.Header) []byte { h.Del(webhook.HeaderXID); return nil }, signedAt, webhook.ErrMissingXHeaders},
		{"missing signature", secrets, func(h http.Header) []byte { h.Del(webhook.HeaderXSignature); return nil }, signedAt, webhook.ErrMissingXHeaders},
		{"timestamp header changed", secrets, func(h http.Header) []byte {
			h.Set(webhook.HeaderXTimestamp, signedAt.Add(time.Second).UTC().Format(time.RFC3339))
			return nil
		}, signedAt, webhook.ErrMalformedXSignature},
		{"signature without t", secrets, func(h http.Header) []byte {
			h.Set(webhook.HeaderXSignature, strings.SplitN(h.Get(webhook.HeaderXSignature), ",", 2)[1])
			return nil
		}, signedAt, webhook.ErrMalformedXSignature},
		{"unix seconds instead of RFC 3339", secrets, func(h http.Header) []byte {
			h.Set(webhook.HeaderXTimestamp, "1780827373")
			h.Set(webhook.HeaderXSignature, "t=1780827373,v1=00")
			return nil
		}, signedAt, webhook.ErrInvalidTimestamp},
		{"replayed later", secrets, nil, signedAt.Add(webhook.DefaultTolerance + time.Second), webhook.ErrTimestampTooOld},
		{"signed in the future", secrets, nil, signedAt.Add(-webhook.DefaultTolerance - time.Second), webhook.ErrTimestampTooNew},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := xSignedHeaders(secrets, signedAt)
			body := testMessage.Body
			if tt.edit != nil {
				if b := tt.edit(h); b != nil {
					body = b
				}
			}
			err := webhook.VerifyXWebhook(tt.secrets, h, body, tt.now)
			if !errors.Is(err, tt.want) {
				t.Fatalf("VerifyXWebhook = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestDeliveryInXWebhookStyleVerifiesAtTheReceiver(t *testing.T) {
	rc := newReceiver(t, answerAlways(http.StatusOK))
	clock := newFakeClock(0)
	d := webhook.NewDeliverer(testOptions(clock))
	ep := rc.endpoint(t, "seed")
	ep.Style, ep.Secrets = webhook.XWebhook, []webhook.Secret{mustRawSecret(t, "seed-secret"), mustRawSecret(t, "old")}
	msg := testMessage
	msg.Type = "operation.succeeded"

	if out := d.Deliver(context.Background(), ep, msg); out.Result != webhook.Delivered {
		t.Fatalf("Deliver = %+v, want Delivered", out)
	}
	got := rc.requests()[0]
	if got.header.Get(webhook.HeaderXID) != msg.ID || got.header.Get(webhook.HeaderEventType) != msg.Type {
		t.Errorf("X-Webhook-Id %q, X-Event-Type %q", got.header.Get(webhook.HeaderXID), got.header.Get(webhook.HeaderEventType))
	}
	if got.header.Get(webhook.HeaderSignature) != "" || got.header.Get(webhook.HeaderID) != "" {
		t.Errorf("an X-Webhook delivery also carries Standard Webhooks headers: %v", got.header)
	}
	if err := webhook.VerifyXWebhook([]webhook.Secret{mustRawSecret(t, "old")}, got.header, got.body, clock.Now()); err != nil {
		t.Errorf("the delivery does not verify with the old secret: %v", err)
	}
}

func TestEveryDeliveryCarriesTheEventType(t *testing.T) {
	for _, style := range []webhook.Style{webhook.StandardWebhooks, webhook.XWebhook} {
		t.Run(style.String(), func(t *testing.T) {
			rc := newReceiver(t, answerAlways(http.StatusOK))
			d := webhook.NewDeliverer(testOptions(newFakeClock(0)))
			ep := rc.endpoint(t, "ep")
			ep.Style = style
			msg := testMessage
			msg.Type = "operation.failed"
			d.Deliver(context.Background(), ep, msg)
			if got := rc.requests()[0].header.Get(webhook.HeaderEventType); got != msg.Type {
				t.Fatalf("X-Event-Type = %q, want %q", got, msg.Type)
			}
		})
	}
}

func TestParseStyleRejectsUnknownNames(t *testing.T) {
	if _, err := webhook.ParseStyle("x-hub"); err == nil || !strings.Contains(err.Error(), `unknown signature style "x-hub"`) {
		t.Fatalf("ParseStyle(x-hub) = %v", err)
	}
}

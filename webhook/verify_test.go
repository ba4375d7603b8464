package webhook_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/webhook"
)

var signedAt = time.Unix(1_780_827_373, 0)

// signedHeaders returns the headers of one attempt of testMessage.
func signedHeaders(secrets []webhook.Secret, ts time.Time) http.Header {
	h := http.Header{}
	h.Set(webhook.HeaderID, testMessage.ID)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(webhook.HeaderSignature, webhook.Sign(secrets, testMessage.ID, ts, testMessage.Body))
	return h
}

func TestSignedMessageVerifies(t *testing.T) {
	secrets := []webhook.Secret{mustSecret(t, currentSecretText)}
	h := signedHeaders(secrets, signedAt)

	sig := h.Get(webhook.HeaderSignature)
	if !strings.HasPrefix(sig, "v1,") || strings.Contains(sig, " ") {
		t.Fatalf("signature header %q, want a single v1,<base64>", sig)
	}
	if err := webhook.Verify(secrets, h, testMessage.Body, signedAt); err != nil {
		t.Fatalf("Verify = %v, want nil", err)
	}
}

func TestRotationSignsWithEverySecretAndEitherVerifies(t *testing.T) {
	current, old := mustSecret(t, currentSecretText), mustSecret(t, oldSecretText)
	h := signedHeaders([]webhook.Secret{current, old}, signedAt)

	sigs := strings.Fields(h.Get(webhook.HeaderSignature))
	if len(sigs) != 2 {
		t.Fatalf("got %d signatures %q, want 2", len(sigs), sigs)
	}
	if want := webhook.Sign([]webhook.Secret{current}, testMessage.ID, signedAt, testMessage.Body); sigs[0] != want {
		t.Errorf("first signature %q, want the current secret's %q", sigs[0], want)
	}
	for name, verifier := range map[string][]webhook.Secret{
		"current only":       {current},
		"old only":           {old},
		"other then current": {mustSecret(t, otherSecretText), current},
	} {
		if err := webhook.Verify(verifier, h, testMessage.Body, signedAt); err != nil {
			t.Errorf("verifier with %s: Verify = %v, want nil", name, err)
		}
	}
}

func TestVerifyRejectsForgedOrReplayedDeliveries(t *testing.T) {
	secrets := []webhook.Secret{mustSecret(t, currentSecretText)}
	tests := []struct {
		name   string
		secret []webhook.Secret
		edit   func(h http.Header) []byte // returns the body to verify
		now    time.Time
		want   error
	}{
		{name: "tampered body", edit: func(http.Header) []byte { return []byte(`{"event_type":"operation.failed"}`) }, want: webhook.ErrNoMatchingSignature},
		{name: "tampered id", edit: func(h http.Header) []byte { h.Set(webhook.HeaderID, "evt_other"); return testMessage.Body }, want: webhook.ErrNoMatchingSignature},
		{name: "tampered timestamp", edit: func(h http.Header) []byte {
			h.Set(webhook.HeaderTimestamp, strconv.FormatInt(signedAt.Unix()+1, 10))
			return testMessage.Body
		}, want: webhook.ErrNoMatchingSignature},
		{name: "wrong secret", secret: []webhook.Secret{mustSecret(t, otherSecretText)}, want: webhook.ErrNoMatchingSignature},
		{name: "no secrets", secret: []webhook.Secret{}, want: webhook.ErrNoMatchingSignature},
		{name: "only an asymmetric signature", edit: func(h http.Header) []byte {
			h.Set(webhook.HeaderSignature, "v1a,"+strings.TrimPrefix(h.Get(webhook.HeaderSignature), "v1,"))
			return testMessage.Body
		}, want: webhook.ErrNoMatchingSignature},
		{name: "older than five minutes", now: signedAt.Add(webhook.DefaultTolerance + time.Second), want: webhook.ErrTimestampTooOld},
		{name: "more than five minutes ahead", now: signedAt.Add(-webhook.DefaultTolerance - time.Second), want: webhook.ErrTimestampTooNew},
		{name: "missing id", edit: deleteHeader(webhook.HeaderID), want: webhook.ErrMissingHeaders},
		{name: "missing timestamp", edit: deleteHeader(webhook.HeaderTimestamp), want: webhook.ErrMissingHeaders},
		{name: "missing signature", edit: deleteHeader(webhook.HeaderSignature), want: webhook.ErrMissingHeaders},
		{name: "timestamp not unix seconds", edit: func(h http.Header) []byte {
			h.Set(webhook.HeaderTimestamp, signedAt.Format(time.RFC3339))
			return testMessage.Body
		}, want: webhook.ErrInvalidTimestamp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := signedHeaders(secrets, signedAt)
			body := testMessage.Body
			if tt.edit != nil {
				body = tt.edit(h)
			}
			verifier, now := secrets, signedAt
			if tt.secret != nil {
				verifier = tt.secret
			}
			if !tt.now.IsZero() {
				now = tt.now
			}
			if err := webhook.Verify(verifier, h, body, now); !errors.Is(err, tt.want) {
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestVerifyAcceptsClockSkewWithinTolerance(t *testing.T) {
	secrets := []webhook.Secret{mustSecret(t, currentSecretText)}
	h := signedHeaders(secrets, signedAt)
	for _, skew := range []time.Duration{-webhook.DefaultTolerance, 0, webhook.DefaultTolerance} {
		if err := webhook.Verify(secrets, h, testMessage.Body, signedAt.Add(skew)); err != nil {
			t.Errorf("skew %v: Verify = %v, want nil", skew, err)
		}
	}
}

func deleteHeader(name string) func(http.Header) []byte {
	return func(h http.Header) []byte {
		h.Del(name)
		return testMessage.Body
	}
}

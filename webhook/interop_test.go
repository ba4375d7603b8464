package webhook_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/mulligan-gw/mulligan/webhook"
)

// The reference Go library of Standard Webhooks must accept what we send, and
// we must accept what it signs: consumers are promised any Standard Webhooks
// library will do.

func referenceVerifier(t *testing.T, secret string) *standardwebhooks.Webhook {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatalf("standardwebhooks.NewWebhook: %v", err)
	}
	return wh
}

func TestReferenceLibrarySignsExactlyLikeUs(t *testing.T) {
	want, err := referenceVerifier(t, currentSecretText).Sign(testMessage.ID, signedAt, testMessage.Body)
	if err != nil {
		t.Fatal(err)
	}
	got := webhook.Sign([]webhook.Secret{mustSecret(t, currentSecretText)}, testMessage.ID, signedAt, testMessage.Body)
	if got != want {
		t.Fatalf("Sign = %q, reference library signs %q", got, want)
	}

	h := signedHeaders(nil, signedAt)
	h.Set(webhook.HeaderSignature, want)
	if err := webhook.Verify([]webhook.Secret{mustSecret(t, currentSecretText)}, h, testMessage.Body, signedAt); err != nil {
		t.Fatalf("Verify of the reference library's signature = %v", err)
	}
}

func TestReferenceLibraryVerifiesOurDeliveriesDuringRotation(t *testing.T) {
	for _, secret := range []string{currentSecretText, oldSecretText} {
		wh := referenceVerifier(t, secret)
		verdict := make(chan error, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			verdict <- wh.Verify(body, r.Header)
			w.WriteHeader(http.StatusNoContent)
		}))
		d := webhook.NewDeliverer(webhook.Options{Now: time.Now}) // the library checks against the real clock
		ep := webhook.Endpoint{
			Name:         "reference",
			URL:          srv.URL,
			Secrets:      []webhook.Secret{mustSecret(t, currentSecretText), mustSecret(t, oldSecretText)},
			AllowPrivate: true,
		}

		out := d.Deliver(context.Background(), ep, testMessage)
		srv.Close()

		if out.Result != webhook.Delivered {
			t.Fatalf("Deliver = %v (%v)", out.Result, out.Err)
		}
		if err := <-verdict; err != nil {
			t.Errorf("reference library holding %s rejects our delivery: %v", strings.TrimPrefix(secret, "whsec_")[:4], err)
		}
	}
}

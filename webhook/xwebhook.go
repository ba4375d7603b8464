package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Style is how a delivery is signed and which headers carry the signature.
type Style int

const (
	// StandardWebhooks signs per Standard Webhooks v1: webhook-id, webhook-timestamp (unix
	// seconds) and webhook-signature ("v1,<base64>" per secret). The default.
	StandardWebhooks Style = iota
	// XWebhook signs in the X-Webhook-* style of the seed documents: X-Webhook-Id,
	// X-Webhook-Timestamp (RFC 3339, UTC) and X-Webhook-Signature
	// ("t=<timestamp>,v1=<hex>", one v1= per secret).
	XWebhook
)

// String returns the style's configuration name.
func (s Style) String() string {
	if s == XWebhook {
		return "x-webhook"
	}
	return "standard-webhooks"
}

// ParseStyle reads a style's configuration name; "" is the default, StandardWebhooks.
func ParseStyle(name string) (Style, error) {
	switch name {
	case "", "standard-webhooks":
		return StandardWebhooks, nil
	case "x-webhook":
		return XWebhook, nil
	}
	return 0, fmt.Errorf("webhook: unknown signature style %q (use standard-webhooks or x-webhook)", name)
}

// Headers of the X-Webhook style, and the event type every delivery carries in both styles.
const (
	// HeaderXID carries the event id, stable across retries: the consumer's dedupe key.
	HeaderXID = "X-Webhook-Id"
	// HeaderXTimestamp carries the RFC 3339 UTC time at which this attempt was signed.
	HeaderXTimestamp = "X-Webhook-Timestamp"
	// HeaderXSignature carries "t=<X-Webhook-Timestamp>,v1=<hex>[,v1=<hex>...]".
	HeaderXSignature = "X-Webhook-Signature"
	// HeaderEventType carries the event's type (operation.succeeded, ...) on every delivery.
	HeaderEventType = "X-Event-Type"
)

// Errors returned by [VerifyXWebhook] besides the timestamp and signature errors it shares
// with [Verify]; compare with errors.Is.
var (
	// ErrMissingXHeaders means X-Webhook-Id, X-Webhook-Timestamp or X-Webhook-Signature is absent.
	ErrMissingXHeaders = errors.New("webhook: missing X-Webhook-Id, X-Webhook-Timestamp or X-Webhook-Signature header")
	// ErrMalformedXSignature means X-Webhook-Signature is not "t=<timestamp>,v1=<hex>..." or its
	// t differs from X-Webhook-Timestamp.
	ErrMalformedXSignature = errors.New("webhook: X-Webhook-Signature is not t=<X-Webhook-Timestamp>,v1=<hex>")
)

// RawSecret uses s, byte for byte, as an HMAC key: the X-Webhook style signs with the secret
// exactly as configured (a "whsec_" prefix, if any, is part of the key), so a consumer passes
// the same string to its HMAC.
func RawSecret(s string) (Secret, error) {
	if s == "" {
		return Secret{}, fmt.Errorf("%w: it is empty", ErrInvalidSecret)
	}
	return Secret{key: []byte(s)}, nil
}

// SignXWebhook returns the X-Webhook-Signature value for one attempt signed at ts:
// "t=<RFC 3339 UTC>,v1=<hex HMAC-SHA256 of "<t>.<body>">", one v1= per secret in the order
// given (current secret first). ts is truncated to whole seconds, as sent in
// X-Webhook-Timestamp.
func SignXWebhook(secrets []Secret, ts time.Time, body []byte) string {
	stamp := formatXTimestamp(ts)
	var b strings.Builder
	b.WriteString("t=" + stamp)
	for _, s := range secrets {
		b.WriteString(",v1=" + hex.EncodeToString(xmac(s, stamp, body)))
	}
	return b.String()
}

// VerifyXWebhook checks a delivery in the X-Webhook style: the three headers are present,
// the signature's t equals X-Webhook-Timestamp and is within [DefaultTolerance] of now, and
// at least one v1= matches the body under at least one of secrets (several = rotation; make
// them with [RawSecret]). Signatures are compared in constant time.
//
// body must be the raw request body, byte for byte. Deduplicate on X-Webhook-Id after
// VerifyXWebhook succeeds.
func VerifyXWebhook(secrets []Secret, h http.Header, body []byte, now time.Time) error {
	id, stamp, header := h.Get(HeaderXID), h.Get(HeaderXTimestamp), h.Get(HeaderXSignature)
	if id == "" || stamp == "" || header == "" {
		return ErrMissingXHeaders
	}
	t, received := parseXSignature(header)
	if t != stamp {
		return ErrMalformedXSignature
	}
	ts, err := time.Parse(time.RFC3339, stamp)
	if err != nil {
		return ErrInvalidTimestamp
	}
	switch {
	case now.Sub(ts) > DefaultTolerance:
		return ErrTimestampTooOld
	case ts.Sub(now) > DefaultTolerance:
		return ErrTimestampTooNew
	}
	for _, s := range secrets {
		want := xmac(s, stamp, body)
		for _, got := range received {
			if hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return ErrNoMatchingSignature
}

// parseXSignature splits "t=<ts>,v1=<hex>,..." into t and the decoded v1 signatures, skipping
// other versions and malformed entries.
func parseXSignature(header string) (string, [][]byte) {
	var t string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		switch {
		case !ok:
		case k == "t":
			t = v
		case k == signatureVersion:
			if sig, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	return t, sigs
}

// xmac computes HMAC-SHA256 over "<t>.<body>", the signed content of the X-Webhook style.
func xmac(s Secret, stamp string, body []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(stamp))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// formatXTimestamp renders ts as the X-Webhook-Timestamp header value.
func formatXTimestamp(ts time.Time) string {
	return ts.UTC().Format(time.RFC3339) // whole seconds
}

// signHeaders stamps one attempt in style: the id, a fresh timestamp and its signatures.
func signHeaders(h http.Header, style Style, secrets []Secret, msgID string, now time.Time, body []byte) {
	if style == XWebhook {
		h.Set(HeaderXID, msgID)
		h.Set(HeaderXTimestamp, formatXTimestamp(now))
		h.Set(HeaderXSignature, SignXWebhook(secrets, now, body))
		return
	}
	h.Set(HeaderID, msgID)
	h.Set(HeaderTimestamp, formatTimestamp(now))
	h.Set(HeaderSignature, Sign(secrets, msgID, now, body))
}

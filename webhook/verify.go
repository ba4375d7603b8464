package webhook

import (
	"crypto/hmac"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultTolerance is how far webhook-timestamp may be from the verifier's
// clock, in either direction, before a delivery is refused as a replay. It is
// the window the Standard Webhooks reference libraries enforce.
const DefaultTolerance = 5 * time.Minute

// Errors returned by [Verify]; compare with errors.Is.
var (
	// ErrMissingHeaders means webhook-id, webhook-timestamp or webhook-signature is absent.
	ErrMissingHeaders = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature header")
	// ErrInvalidTimestamp means webhook-timestamp is not an integer number of unix seconds.
	ErrInvalidTimestamp = errors.New("webhook: webhook-timestamp is not unix seconds")
	// ErrTimestampTooOld means the attempt was signed more than DefaultTolerance ago.
	ErrTimestampTooOld = errors.New("webhook: webhook-timestamp is too old")
	// ErrTimestampTooNew means the attempt claims to be signed more than DefaultTolerance in the future.
	ErrTimestampTooNew = errors.New("webhook: webhook-timestamp is too far in the future")
	// ErrNoMatchingSignature means no v1 signature in the header matches any of the secrets.
	ErrNoMatchingSignature = errors.New("webhook: no matching signature")
)

// Verify checks a received delivery: the three headers are present, the
// timestamp is within [DefaultTolerance] of now, and at least one "v1"
// signature in webhook-signature matches the body under at least one of
// secrets (several secrets = rotation). Signatures are compared in constant
// time; signatures of other versions (such as "v1a") are ignored.
//
// body must be the raw request body, byte for byte: re-encoded JSON does not
// verify. Deduplicate on webhook-id after Verify succeeds.
func Verify(secrets []Secret, h http.Header, body []byte, now time.Time) error {
	msgID, stamp, header := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if msgID == "" || stamp == "" || header == "" {
		return ErrMissingHeaders
	}
	unix, err := strconv.ParseInt(stamp, 10, 64)
	if err != nil {
		return ErrInvalidTimestamp
	}
	ts := time.Unix(unix, 0)
	switch {
	case now.Sub(ts) > DefaultTolerance:
		return ErrTimestampTooOld
	case ts.Sub(now) > DefaultTolerance:
		return ErrTimestampTooNew
	}
	received := receivedSignatures(header)
	for _, s := range secrets {
		want := mac(s, msgID, formatTimestamp(ts), body)
		for _, got := range received {
			if hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return ErrNoMatchingSignature
}

// receivedSignatures decodes the "v1" entries of a webhook-signature header,
// skipping other versions and malformed entries.
func receivedSignatures(header string) [][]byte {
	var sigs [][]byte
	for _, entry := range strings.Fields(header) {
		version, encoded, ok := strings.Cut(entry, ",")
		if !ok || version != signatureVersion {
			continue
		}
		if sig, err := base64.StdEncoding.DecodeString(encoded); err == nil {
			sigs = append(sigs, sig)
		}
	}
	return sigs
}

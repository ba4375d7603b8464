package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks header names. Go canonicalises them on the wire; the
// lower-case spelling is the one the specification uses.
const (
	// HeaderID carries the message id, stable across retries: the consumer's dedupe key.
	HeaderID = "webhook-id"
	// HeaderTimestamp carries the unix seconds at which this attempt was signed.
	HeaderTimestamp = "webhook-timestamp"
	// HeaderSignature carries space-separated "v1,<base64>" signatures, one per secret.
	HeaderSignature = "webhook-signature"
)

// signatureVersion identifies HMAC-SHA256 signatures in Standard Webhooks.
const signatureVersion = "v1"

// Sign returns the webhook-signature header value for one attempt: one
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>" per secret, in the order
// given (current secret first), separated by spaces. ts is truncated to
// whole seconds, as sent in webhook-timestamp.
func Sign(secrets []Secret, msgID string, ts time.Time, body []byte) string {
	stamp := formatTimestamp(ts)
	sigs := make([]string, len(secrets))
	for i, s := range secrets {
		sigs[i] = signatureVersion + "," + base64.StdEncoding.EncodeToString(mac(s, msgID, stamp, body))
	}
	return strings.Join(sigs, " ")
}

// mac computes HMAC-SHA256 over "{id}.{timestamp}.{body}", the signed
// content of Standard Webhooks v1.
func mac(s Secret, msgID, stamp string, body []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(msgID))
	h.Write([]byte{'.'})
	h.Write([]byte(stamp))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// formatTimestamp renders ts as the webhook-timestamp header value.
func formatTimestamp(ts time.Time) string {
	return strconv.FormatInt(ts.Unix(), 10)
}

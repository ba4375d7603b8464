package webhook

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// SecretPrefix marks a Standard Webhooks signing secret; it is stripped
// before the rest is base64-decoded.
const SecretPrefix = "whsec_"

// ErrInvalidSecret is returned (wrapped) by [ParseSecret] for anything it
// cannot use as a signing key.
var ErrInvalidSecret = errors.New("webhook: invalid signing secret")

// Secret is an HMAC-SHA256 signing key. Its String and GoString methods
// never reveal the key, so a Secret may appear in logs and errors safely.
type Secret struct {
	key []byte
}

// ParseSecret decodes a signing secret in the Standard Webhooks
// serialisation: "whsec_" followed by standard base64 with padding. The
// prefix is optional, as in the reference libraries, so a bare base64 key
// is accepted too.
//
// The specification asks for random secrets of 24 to 64 bytes. ParseSecret
// is lenient and accepts any non-empty key, because refusing a secret a
// consumer already uses would break their deliveries; generate new secrets
// with at least 24 random bytes.
func ParseSecret(s string) (Secret, error) {
	encoded, prefixed := strings.CutPrefix(strings.TrimSpace(s), SecretPrefix)
	if encoded == "" {
		return Secret{}, fmt.Errorf("%w: it is empty (expected %s followed by base64)", ErrInvalidSecret, SecretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(encoded)
	switch {
	case err != nil && prefixed:
		return Secret{}, fmt.Errorf("%w: the part after %s is not standard base64: %v", ErrInvalidSecret, SecretPrefix, err)
	case err != nil: // the prefix is optional, as in the reference libraries: say both forms
		return Secret{}, fmt.Errorf("%w: it is neither %s followed by base64 nor bare base64 (generate one with: echo %s$(openssl rand -base64 32)): %v",
			ErrInvalidSecret, SecretPrefix, SecretPrefix, err)
	}
	if len(key) == 0 {
		return Secret{}, fmt.Errorf("%w: it decodes to no bytes", ErrInvalidSecret)
	}
	return Secret{key: key}, nil
}

// String returns a redacted placeholder, never the key.
func (s Secret) String() string { return SecretPrefix + "[redacted]" }

// GoString returns a redacted placeholder so %#v does not leak the key.
func (s Secret) GoString() string { return "webhook.Secret{[redacted]}" }

package idemkey

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/mulligan-gw/mulligan/internal/fingerprint"
)

// Scope is the stored form of a tenant scope: its raw value is never stored.
func Scope(scope string) string {
	h := sha256.Sum256([]byte(scope))
	return hex.EncodeToString(h[:16])
}

// Record names a record by (scope hash, method, route path, key): tenants never share one.
func Record(scope, method, path, key string) []byte {
	h := sha256.New()
	fingerprint.WriteField(h, []byte(Scope(scope)))
	for _, part := range []string{method, path, key} {
		fingerprint.WriteField(h, []byte(part))
	}
	return h.Sum(nil)
}

package module

import "github.com/mulligan-gw/mulligan/internal/fingerprint"

// RecordKey is the store key under which the gateway records an idempotency key sent with
// method and path by a caller whose scope value is scope. Tools that seed or inspect a store
// (bench, operators' scripts) use it to address the records the gateway reads.
func RecordKey(scope, method, path, key string) []byte { return recordKey(scope, method, path, key) }

// Fingerprint is the fingerprint the gateway computes for a request, with no
// fingerprint_ignore pointers: with RecordKey, what a seeded record must carry to replay.
func Fingerprint(method, path, query, contentType string, body []byte) []byte {
	f, _ := fingerprint.New(nil)
	return f.Sum(method, path, query, contentType, body)
}

// ScopeHash is the stored form of a caller's scope value (operations carry it).
func ScopeHash(scope string) string { return scopeHash(scope) }

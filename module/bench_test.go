package module

import (
	"fmt"
	"strings"
	"testing"

	"github.com/mulligan-gw/mulligan/internal/fingerprint"
)

// benchChatRequest is an OpenAI-style chat request of about size bytes: a few nested objects
// (messages, tools with JSON-schema parameters, metadata) and user text filling the rest.
func benchChatRequest(size int) []byte {
	const frame = `{"model":"mulligan-demo","temperature":0.7,"max_tokens":512,"stream":false,` +
		`"metadata":{"request_id":"req-123","tenant":{"id":"t-42","plan":"pro"}},` +
		`"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object",` +
		`"properties":{"query":{"type":"string"},"limit":{"type":"integer","minimum":1}},"required":["query"]}}}],` +
		`"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":%q}]}`
	filler := strings.Repeat("Summarise the attached meeting notes in three bullet points. ", size/60+1)
	body := fmt.Sprintf(frame, filler)
	return []byte(fmt.Sprintf(frame, filler[:max(0, len(filler)-(len(body)-size))]))
}

// BenchmarkFingerprint is the per-request cost of a keyed request's fingerprint: JSON
// canonicalisation and SHA-256.
func BenchmarkFingerprint(b *testing.B) {
	fp, err := fingerprint.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{2 << 10, 64 << 10} {
		body := benchChatRequest(size)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				fp.Sum("POST", "/v1/chat/completions", "", "application/json", body)
			}
		})
	}
}

// BenchmarkParseKey is the cost of validating an Idempotency-Key header, bare and as an
// RFC 8941 quoted string.
func BenchmarkParseKey(b *testing.B) {
	for name, v := range map[string]string{
		"bare":   "order-42-7f3c9a2e-1b4d-4c8e-9f00-5a6b7c8d9e0f",
		"quoted": `"order-42-7f3c9a2e-1b4d-4c8e-9f00-5a6b7c8d9e0f"`,
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseKey(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package idemkey

import (
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"abc", "abc", true},
		{"8c9d-11ef", "8c9d-11ef", true},
		{`"abc"`, "abc", true},
		{`"a\"b\\c"`, `a"b\c`, true},
		{"with space", "with space", true},
		{strings.Repeat("k", 255), strings.Repeat("k", 255), true},
		{"", "", false},
		{`""`, "", false},
		{strings.Repeat("k", 256), "", false},
		{"tab\there", "", false},
		{"é", "", false},
		{`"unterminated`, "", false},
		{`"bad\x"`, "", false},
		{`"in"side"`, "", false},
	} {
		got, err := Parse(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("Parse(%q) = %q, %v; want %q ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, "", `"`, `"\`, strings.Repeat("x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		k, err := Parse(in)
		if err != nil {
			return
		}
		if len(k) == 0 || len(k) > MaxLen {
			t.Fatalf("accepted a key of length %d", len(k))
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("accepted byte %#x", k[i])
			}
		}
	})
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
				if _, err := Parse(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

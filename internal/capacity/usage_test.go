package capacity

import "testing"

func TestCompletionTokensReadsTheLastUsage(t *testing.T) {
	for _, c := range []struct {
		body string
		want int
	}{
		{`{"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`, 12},
		{`{"usage": {"completion_tokens" : 7 }}`, 7},
		{"data: {\"usage\":null}\n\ndata: {\"usage\":{\"completion_tokens\":30}}\n\ndata: [DONE]\n\n", 30},
		{`{"completion_tokens":"x"}`, 0},
		{`{"completion_tokens":12`, 0}, // cut: the number may go on
		{`{"error":{"message":"bad"}}`, 0},
		{`{"completion_tokens":99999999999}`, 0},
	} {
		if got := CompletionTokens([]byte(c.body)); got != c.want {
			t.Errorf("%s: %d, want %d", c.body, got, c.want)
		}
	}
}

func TestTokenScannerFindsAKeySplitAcrossWrites(t *testing.T) {
	body := `{"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":451,"total_tokens":454}}`
	for cut := 1; cut < len(body); cut++ {
		var s TokenScanner
		s.Write([]byte(body[:cut]))
		s.Write([]byte(body[cut:]))
		if s.Tokens() != 451 {
			t.Fatalf("split at %d: %d tokens, want 451", cut, s.Tokens())
		}
	}
}

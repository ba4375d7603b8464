package batches

import (
	"fmt"
	"strings"
	"testing"
)

// TestBatchValidationBoundsCustomIDsAndEchoedValues: a custom_id over 512 bytes is a line error,
// and a caller's value quoted in an error message is cut to 100 bytes, so a hostile file cannot
// grow the batch document with its own text.
func TestBatchValidationBoundsCustomIDsAndEchoedValues(t *testing.T) {
	line := func(id, url string) string {
		return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":%q,"body":{}}`+"\n", id, url)
	}
	long := strings.Repeat("é", 2000) // 4,000 bytes, two per character
	input := line(long, "/v1/chat/completions") + line("ok", "/v1/"+long) + line(strings.Repeat("d", 512), "/v1/chat/completions") + line(strings.Repeat("d", 512), "/v1/chat/completions")
	n, errs, err := ValidateLines(strings.NewReader(input), "/v1/chat/completions")
	if err != nil || n != 4 || len(errs) != 3 {
		t.Fatalf("%d lines, errors %+v (%v); want 4 lines, 3 errors", n, errs, err)
	}
	want := []struct {
		code string
		line int
		text string
	}{{"invalid_custom_id", 1, "is over 512 bytes"}, {"invalid_url", 2, "differs from the batch's endpoint"}, {"duplicate_custom_id", 4, "was already used on line 3"}}
	for i, w := range want {
		e := errs[i]
		if e.Code != w.code || e.Line != w.line || !strings.Contains(e.Message, w.text) || len(e.Message) > 200 {
			t.Fatalf("error %d: %+v (%d bytes), want %s on line %d saying %q in at most 200 bytes", i, e, len(e.Message), w.code, w.line, w.text)
		}
	}
	if !strings.Contains(errs[0].Message, `..."`) && !strings.Contains(errs[0].Message, `"...`) {
		t.Fatalf("a long custom_id is echoed whole: %s", errs[0].Message)
	}
}

package capacity

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// What the adaptive limit reads of a sync answer: its status, whether it streams, the time to
// its first byte and its usage's completion_tokens (docs/capacity.md, "limit auto").
func TestCapacityStatusWriterTellsTheLimitHowTheAnswerWent(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	start := clock.Now()
	rec := httptest.NewRecorder()
	w := &AnswerWriter{ResponseWriter: rec, Now: clock.Now}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	clock.Advance(40 * time.Millisecond)
	_, _ = w.Write([]byte("data: {\"choices\":[]}\n\n"))
	clock.Advance(time.Second)
	_, _ = w.Write([]byte("data: {\"usage\":{\"completion_tokens\":"))
	_, _ = w.Write([]byte("87}}\n\ndata: [DONE]\n\n"))
	got := w.Sample(start, nil)
	if want := (Sample{Status: 200, Stream: true, FirstByte: 40 * time.Millisecond, Tokens: 87}); got != want {
		t.Fatalf("sample %+v; want %+v", got, want)
	}
	bad := &AnswerWriter{ResponseWriter: httptest.NewRecorder(), Now: clock.Now}
	bad.WriteHeader(http.StatusBadRequest)
	_, _ = bad.Write([]byte(`{"usage":{"completion_tokens":5}}`))
	if got := bad.Sample(start, nil); got.Status != 400 || got.Tokens != 0 || got.Overloaded {
		t.Fatalf("a 400: %+v; want status 400, no tokens, not overloaded", got)
	}
}

// A body goes upstream as JSON when its media type says so, before any parameter, or when it
// has none: then a model server may read it as JSON.
func TestIsJSONReadsTheMediaTypeAsAModelServerDoes(t *testing.T) {
	for _, c := range []struct {
		ct   string
		size int64
		want bool
	}{
		{"application/json", 10, true},
		{"Application/JSON; charset=utf-8", 10, true},
		{"application/json; =broken", 10, true},
		{"application/vnd.api+json", 10, true},
		{"", 10, true},
		{"", -1, true},
		{"", 0, false},
		{"text/plain", 10, false},
		{"multipart/form-data; boundary=x", 10, false},
	} {
		if got := IsJSON(c.ct, c.size); got != c.want {
			t.Errorf("IsJSON(%q, %d) = %v, want %v", c.ct, c.size, got, c.want)
		}
	}
}

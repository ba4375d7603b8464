package apierr

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestWriteAnswersTheCataloguesStatusAndRetryability(t *testing.T) {
	w := httptest.NewRecorder()
	w.Header().Set(HeaderRequestID, "req_1")
	Write(w, Error{Code: CodeUpstreamSaturated, Message: "busy", RetryAfter: 1500 * time.Millisecond})
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", w.Code)
	}
	if got := w.Header().Get("Retry-After"); got != "2" {
		t.Fatalf("Retry-After %q, want 2 (rounded up)", got)
	}
	var b Body
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	if b.Error.Code != CodeUpstreamSaturated || !b.Error.Retryable || b.Error.RequestID != "req_1" ||
		b.Error.Details["retry_after_seconds"] != float64(2) {
		t.Fatalf("body %+v", b.Error)
	}
}

func TestStatusOverrideKeepsTheCode(t *testing.T) {
	w := httptest.NewRecorder()
	Write(w, Error{Code: CodeKeyReused, Status: http.StatusUnprocessableEntity})
	if w.Code != http.StatusUnprocessableEntity || Status(CodeKeyReused) != http.StatusConflict {
		t.Fatalf("status %d, catalogue %d", w.Code, Status(CodeKeyReused))
	}
}

func TestFailureTakesTheCataloguesRetryability(t *testing.T) {
	if !Failure(CodeQueueTimeout, "x").Retryable || Failure(CodeUpstreamRejected, "x").Retryable {
		t.Fatal("retryability differs from the catalogue")
	}
}

func TestWriteOpenAIAddsOpenAIsErrorType(t *testing.T) {
	for _, c := range []struct {
		e    Error
		want string
	}{
		{Error{Code: CodeInvalidRequest, Param: Param("limit")}, "invalid_request_error"},
		{Error{Code: CodeStorage}, "server_error"},
		{Error{Code: CodeStorage, Type: "custom"}, "custom"},
	} {
		w := httptest.NewRecorder()
		WriteOpenAI(w, c.e)
		var b Body
		if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
			t.Fatal(err)
		}
		if b.Error.Type != c.want || b.Error.Code != c.e.Code || w.Code != Status(c.e.Code) {
			t.Errorf("%s: %d %+v, want type %s", c.e.Code, w.Code, b.Error, c.want)
		}
	}
	w := httptest.NewRecorder()
	WriteOpenAI(w, Error{Code: CodeInvalidRequest, Param: Param("")})
	if b := w.Body.String(); strings.Contains(b, `"param"`) {
		t.Errorf("an empty param is written: %s", b)
	}
}

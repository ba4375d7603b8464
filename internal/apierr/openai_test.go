package apierr

import (
	"encoding/json"
	"net/http/httptest"
	"testing"
)

// TestWriteOpenAITypesTheErrorByItsStatus: a client fault is an invalid_request_error, the
// gateway's own a server_error, and a type the caller named is kept.
func TestWriteOpenAITypesTheErrorByItsStatus(t *testing.T) {
	for _, c := range []struct {
		e    Error
		want string
	}{
		{Error{Code: CodeInvalidRequest}, "invalid_request_error"},
		{Error{Code: CodeStorage}, "server_error"},
		{Error{Code: CodeInvalidRequest, Type: "not_found_error"}, "not_found_error"},
	} {
		w := httptest.NewRecorder()
		WriteOpenAI(w, c.e)
		var b Body
		if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || b.Error.Type != c.want || b.Error.Code != c.e.Code {
			t.Fatalf("%s: %s, want type %s", c.e.Code, w.Body, c.want)
		}
	}
}

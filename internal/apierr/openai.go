package apierr

import "net/http"

// WriteOpenAI answers e through Write with OpenAI's error type beside the gateway's fields
// (invalid_request_error, server_error from 500 on, unless e names its own), so the official
// SDKs raise their own error classes (docs/batches.md).
func WriteOpenAI(w http.ResponseWriter, e Error) {
	if e.Type == "" {
		e.Type = "invalid_request_error"
		if Status(e.Code) >= 500 {
			e.Type = "server_error"
		}
	}
	Write(w, e)
}

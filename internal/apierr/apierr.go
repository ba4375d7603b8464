// Package apierr is the closed catalogue of the answers the gateway itself makes (docs/api.md,
// Errors): every code with its status and retryability in one place, and the one writer of the
// error schema. A new code goes here, into the constants and the catalogue below.
package apierr

import (
	"encoding/json"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// Code is a stable, machine-readable code of an answer the gateway itself makes
// (docs/api.md, Errors). Every such answer goes through Write.
type Code string

// The error catalogue. Status and retryability live here, in one place.
const (
	CodeKeyRequired       Code = "IDEMPOTENCY_KEY_REQUIRED"
	CodeKeyInvalid        Code = "IDEMPOTENCY_KEY_INVALID"
	CodeKeyReused         Code = "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"
	CodeInProgress        Code = "IDEMPOTENCY_REQUEST_IN_PROGRESS"
	CodeRequestTooLarge   Code = "REQUEST_TOO_LARGE"
	CodeStorage           Code = "STORAGE_UNAVAILABLE"
	CodeOperationNotFound Code = "OPERATION_NOT_FOUND"
	CodeAlreadyFinal      Code = "OPERATION_ALREADY_FINAL"
	CodeNotFinished       Code = "OPERATION_NOT_FINISHED"
	CodeCallbackNotAllow  Code = "CALLBACK_URL_NOT_ALLOWED"
	CodeQueueFull         Code = "QUEUE_FULL"
	CodeRateLimited       Code = "RATE_LIMITED"
	// Beyond the contract's table: malformed calls of the operations API.
	CodeInvalidRequest   Code = "INVALID_REQUEST"
	CodeMethodNotAllowed Code = "METHOD_NOT_ALLOWED"
	// CodeBusy: the request bodies being read at once reached max_buffered (docs/operating.md).
	CodeBusy Code = "GATEWAY_BUSY"
	// The Files and Batches API's own (docs/batches.md).
	CodeFileNotFound      Code = "FILE_NOT_FOUND"
	CodeBatchNotFound     Code = "BATCH_NOT_FOUND"
	CodeBatchAlreadyFinal Code = "BATCH_ALREADY_FINAL"
	// The Responses API's own (docs/responses.md).
	CodeResponseNotFound     Code = "RESPONSE_NOT_FOUND"
	CodeResponseAlreadyFinal Code = "RESPONSE_ALREADY_FINAL"
	// CodeFileQuota: an upload would take its scope over max_scope_bytes or max_scope_files;
	// 400 as OpenAI answers its own storage quota, so the SDKs do not send the file again.
	CodeFileQuota Code = "FILE_QUOTA_EXCEEDED"
	// CodeUpstreamSaturated: no upstream seat came free within capacity.wait (docs/api.md).
	CodeUpstreamSaturated Code = "UPSTREAM_SATURATED"
)

type spec struct {
	status    int
	retryable bool
}

var catalogue = map[Code]spec{
	CodeKeyRequired:       {http.StatusBadRequest, false},
	CodeKeyInvalid:        {http.StatusBadRequest, false},
	CodeKeyReused:         {http.StatusConflict, false},
	CodeInProgress:        {http.StatusConflict, true},
	CodeRequestTooLarge:   {http.StatusRequestEntityTooLarge, false},
	CodeStorage:           {http.StatusServiceUnavailable, true},
	CodeOperationNotFound: {http.StatusNotFound, false},
	CodeAlreadyFinal:      {http.StatusConflict, false},
	CodeNotFinished:       {http.StatusConflict, true},
	CodeCallbackNotAllow:  {http.StatusUnprocessableEntity, false},
	CodeQueueFull:         {http.StatusServiceUnavailable, true},
	CodeRateLimited:       {http.StatusTooManyRequests, true},
	CodeBusy:              {http.StatusServiceUnavailable, true},
	// An `after`-mode call answered within its window fails with the outcome table's code
	// (docs/api.md), as a gateway answer: 502 or 504, never a truncated success.
	CodeUpstreamUnavailable:  {http.StatusBadGateway, true},
	CodeUpstreamError:        {http.StatusBadGateway, true},
	CodeResultTooLarge:       {http.StatusBadGateway, false},
	CodeOperationTimeout:     {http.StatusGatewayTimeout, true},
	CodeInvalidRequest:       {http.StatusBadRequest, false},
	CodeMethodNotAllowed:     {http.StatusMethodNotAllowed, false},
	CodeFileNotFound:         {http.StatusNotFound, false},
	CodeBatchNotFound:        {http.StatusNotFound, false},
	CodeBatchAlreadyFinal:    {http.StatusConflict, false},
	CodeResponseNotFound:     {http.StatusNotFound, false},
	CodeResponseAlreadyFinal: {http.StatusConflict, false},
	CodeFileQuota:            {http.StatusBadRequest, false},
	CodeUpstreamSaturated:    {http.StatusServiceUnavailable, true},
}

// Status is the catalogue's HTTP status of code; zero for a code it does not hold.
func Status(code Code) int { return catalogue[code].status }

// HeaderRequestID is the header that carries the request's id, echoed in every error body.
const HeaderRequestID = "X-Request-Id"

// Error is one answer of the catalogue, ready to write.
type Error struct {
	Code    Code
	Message string
	Details map[string]any
	// Status overrides the catalogue's status where the configuration chooses it
	// (mismatch_status); zero means the catalogue's.
	Status int
	// RetryAfter sets the Retry-After header when above zero.
	RetryAfter time.Duration
	// Type and Param complete OpenAI's error shape for the Files and Batches API
	// (docs/batches.md): set there, omitted elsewhere.
	Type  string
	Param *string
}

// Body is the error schema's envelope (docs/api.md, Errors).
type Body struct {
	Error Fields `json:"error"`
}

// Fields are the error schema's fields.
type Fields struct {
	Code      Code           `json:"code"`
	Message   string         `json:"message"`
	Retryable bool           `json:"retryable"`
	Details   map[string]any `json:"details"`
	RequestID string         `json:"request_id"`
	Type      string         `json:"type,omitempty"`
	Param     *string        `json:"param,omitempty"`
}

// Write writes e in the error schema (docs/api.md, Errors) with the response's request id.
func Write(w http.ResponseWriter, e Error) {
	s := catalogue[e.Code]
	status := s.status
	if e.Status != 0 {
		status = e.Status
	}
	details := make(map[string]any, len(e.Details)+1)
	maps.Copy(details, e.Details)
	if e.RetryAfter > 0 {
		// The body says it too, for clients that read only the body (docs/api.md).
		w.Header().Set("Retry-After", RetryAfterValue(e.RetryAfter))
		details["retry_after_seconds"] = retryAfterSeconds(e.RetryAfter)
	}
	WriteJSON(w, status, Body{Error: Fields{
		Code: e.Code, Message: e.Message, Retryable: s.retryable, Details: details,
		RequestID: w.Header().Get(HeaderRequestID), Type: e.Type, Param: e.Param,
	}})
}

// WriteOpenAI is Write for the OpenAI-shaped APIs (Files and Batches, docs/batches.md;
// Responses, docs/responses.md): e.Type, when unset, is OpenAI's invalid_request_error, or
// server_error for a 5xx, so that the official SDKs raise their own error classes.
func WriteOpenAI(w http.ResponseWriter, e Error) {
	if e.Type == "" {
		e.Type = "invalid_request_error"
		if Status(e.Code) >= 500 {
			e.Type = "server_error"
		}
	}
	Write(w, e)
}

// Param is OpenAI's param of an error: the field it is about, nil for none ("").
func Param(p string) *string {
	if p == "" {
		return nil
	}
	return &p
}

// WriteJSON writes v as a JSON answer with status, never cached.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// OperationDetails names the operation a key's record belongs to, for the details of an
// answer about that key; nil when it has none.
func OperationDetails(rec *store.Record) map[string]any {
	if rec == nil || rec.OperationID == "" {
		return nil
	}
	return map[string]any{"operation_id": rec.OperationID}
}

// RetryAfterValue renders d as whole seconds, rounded up (RFC 9110 §10.2.3).
func RetryAfterValue(d time.Duration) string {
	return strconv.Itoa(retryAfterSeconds(d))
}

// retryAfterSeconds is d in whole seconds, rounded up.
func retryAfterSeconds(d time.Duration) int {
	return int((d + time.Second - 1) / time.Second)
}

// Why an operation failed (docs/api.md, Outcomes): codes of the operation's error, not HTTP answers.
const (
	CodeUpstreamRejected    Code = "UPSTREAM_REJECTED"
	CodeUpstreamUnavailable Code = "UPSTREAM_UNAVAILABLE"
	CodeUpstreamError       Code = "UPSTREAM_ERROR"
	CodeOperationTimeout    Code = "OPERATION_TIMEOUT"
	CodeResultTooLarge      Code = "RESULT_TOO_LARGE"
	CodeWorkerLost          Code = "WORKER_LOST"
	// CodeQueueTimeout: an operation waited in the queue past its deadline (docs/capacity.md).
	CodeQueueTimeout Code = store.QueueTimeoutCode
)

var failureRetryable = map[Code]bool{
	CodeUpstreamRejected: false, CodeUpstreamUnavailable: true, CodeUpstreamError: true,
	CodeOperationTimeout: true, CodeResultTooLarge: false, CodeWorkerLost: true,
	CodeQueueTimeout: true,
}

// Failure is an operation's failure with the catalogue's retryability.
func Failure(code Code, message string) *store.OperationError {
	return &store.OperationError{Code: string(code), Message: message, Retryable: failureRetryable[code]}
}

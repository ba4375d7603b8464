package module

import (
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// ErrorCode is a stable, machine-readable code of an answer the gateway itself makes
// (docs/api.md, Errors). Every such answer goes through writeError.
type ErrorCode string

// The error catalogue. Status and retryability live here, in one place.
const (
	CodeKeyRequired       ErrorCode = "IDEMPOTENCY_KEY_REQUIRED"
	CodeKeyInvalid        ErrorCode = "IDEMPOTENCY_KEY_INVALID"
	CodeKeyReused         ErrorCode = "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"
	CodeInProgress        ErrorCode = "IDEMPOTENCY_REQUEST_IN_PROGRESS"
	CodeRequestTooLarge   ErrorCode = "REQUEST_TOO_LARGE"
	CodeStorage           ErrorCode = "STORAGE_UNAVAILABLE"
	CodeOperationNotFound ErrorCode = "OPERATION_NOT_FOUND"
	CodeAlreadyFinal      ErrorCode = "OPERATION_ALREADY_FINAL"
	CodeNotFinished       ErrorCode = "OPERATION_NOT_FINISHED"
	CodeCallbackNotAllow  ErrorCode = "CALLBACK_URL_NOT_ALLOWED"
	CodeQueueFull         ErrorCode = "QUEUE_FULL"
	CodeRateLimited       ErrorCode = "RATE_LIMITED"
	// Beyond the contract's table: malformed calls of the operations API.
	CodeInvalidRequest   ErrorCode = "INVALID_REQUEST"
	CodeMethodNotAllowed ErrorCode = "METHOD_NOT_ALLOWED"
	// CodeBusy: the request bodies being read at once reached max_buffered (docs/operating.md).
	CodeBusy ErrorCode = "GATEWAY_BUSY"
	// The Files and Batches API's own (docs/batches.md).
	CodeFileNotFound      ErrorCode = "FILE_NOT_FOUND"
	CodeBatchNotFound     ErrorCode = "BATCH_NOT_FOUND"
	CodeBatchAlreadyFinal ErrorCode = "BATCH_ALREADY_FINAL"
	// CodeFileQuota: an upload would take its scope over max_scope_bytes or max_scope_files;
	// 400 as OpenAI answers its own storage quota, so the SDKs do not send the file again.
	CodeFileQuota ErrorCode = "FILE_QUOTA_EXCEEDED"
)

type errorSpec struct {
	status    int
	retryable bool
}

var catalogue = map[ErrorCode]errorSpec{
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
	CodeUpstreamUnavailable: {http.StatusBadGateway, true},
	CodeUpstreamError:       {http.StatusBadGateway, true},
	CodeResultTooLarge:      {http.StatusBadGateway, false},
	CodeOperationTimeout:    {http.StatusGatewayTimeout, true},
	CodeInvalidRequest:      {http.StatusBadRequest, false},
	CodeMethodNotAllowed:    {http.StatusMethodNotAllowed, false},
	CodeFileNotFound:        {http.StatusNotFound, false},
	CodeBatchNotFound:       {http.StatusNotFound, false},
	CodeBatchAlreadyFinal:   {http.StatusConflict, false},
	CodeFileQuota:           {http.StatusBadRequest, false},
}

// apiError is one answer of the catalogue, ready to write.
type apiError struct {
	Code    ErrorCode
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

type errorBody struct {
	Error errorFields `json:"error"`
}

type errorFields struct {
	Code      ErrorCode      `json:"code"`
	Message   string         `json:"message"`
	Retryable bool           `json:"retryable"`
	Details   map[string]any `json:"details"`
	RequestID string         `json:"request_id"`
	Type      string         `json:"type,omitempty"`
	Param     *string        `json:"param,omitempty"`
}

// writeError writes e in the error schema (docs/api.md, Errors) with the response's request id.
func writeError(w http.ResponseWriter, e apiError) {
	spec := catalogue[e.Code]
	status := spec.status
	if e.Status != 0 {
		status = e.Status
	}
	details := make(map[string]any, len(e.Details)+1)
	maps.Copy(details, e.Details)
	if e.RetryAfter > 0 {
		// The body says it too, for clients that read only the body (docs/api.md).
		w.Header().Set("Retry-After", retryAfterValue(e.RetryAfter))
		details["retry_after_seconds"] = retryAfterSeconds(e.RetryAfter)
	}
	writeJSON(w, status, errorBody{Error: errorFields{
		Code: e.Code, Message: e.Message, Retryable: spec.retryable, Details: details,
		RequestID: w.Header().Get(headerRequestID), Type: e.Type, Param: e.Param,
	}})
}

// operationDetails names the operation a key's record belongs to, for the details of an
// answer about that key; nil when it has none.
func operationDetails(rec *store.Record) map[string]any {
	if rec == nil || rec.OperationID == "" {
		return nil
	}
	return map[string]any{"operation_id": rec.OperationID}
}

// retryAfterValue renders d as whole seconds, rounded up (RFC 9110 §10.2.3).
func retryAfterValue(d time.Duration) string {
	return strconv.Itoa(retryAfterSeconds(d))
}

// retryAfterSeconds is d in whole seconds, rounded up.
func retryAfterSeconds(d time.Duration) int {
	return int((d + time.Second - 1) / time.Second)
}

// Why an operation failed (docs/api.md, Outcomes): codes of the operation's error, not HTTP answers.
const (
	CodeUpstreamRejected    ErrorCode = "UPSTREAM_REJECTED"
	CodeUpstreamUnavailable ErrorCode = "UPSTREAM_UNAVAILABLE"
	CodeUpstreamError       ErrorCode = "UPSTREAM_ERROR"
	CodeOperationTimeout    ErrorCode = "OPERATION_TIMEOUT"
	CodeResultTooLarge      ErrorCode = "RESULT_TOO_LARGE"
	CodeWorkerLost          ErrorCode = "WORKER_LOST"
)

var failureRetryable = map[ErrorCode]bool{
	CodeUpstreamRejected: false, CodeUpstreamUnavailable: true, CodeUpstreamError: true,
	CodeOperationTimeout: true, CodeResultTooLarge: false, CodeWorkerLost: true,
}

// catalogueError is an operation's failure with the catalogue's retryability.
func catalogueError(code ErrorCode, message string) *store.OperationError {
	return &store.OperationError{Code: string(code), Message: message, Retryable: failureRetryable[code]}
}

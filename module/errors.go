package module

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// ErrorCode is a stable, machine-readable code of an answer the gateway itself makes
// (CONTRACT.md §5). Every such answer goes through writeError.
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
}

// writeError writes e in the §5 schema. The request id is the one already on the response.
func writeError(w http.ResponseWriter, e apiError) {
	spec := catalogue[e.Code]
	status := spec.status
	if e.Status != 0 {
		status = e.Status
	}
	details := e.Details
	if details == nil {
		details = map[string]any{}
	}
	body, _ := json.Marshal(errorBody{Error: errorFields{
		Code: e.Code, Message: e.Message, Retryable: spec.retryable, Details: details,
		RequestID: w.Header().Get(headerRequestID),
	}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((e.RetryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

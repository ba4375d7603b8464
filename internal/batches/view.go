package batches

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// View is OpenAI's batch object, as GET {prefix}/batches/{id} and a batch.* event show it
// (docs/batches.md).
type View struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Endpoint         string            `json:"endpoint"`
	Errors           *ErrorsView       `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           store.BatchStatus `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        *int64            `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    store.BatchCounts `json:"request_counts"`
	Metadata         json.RawMessage   `json:"metadata"`
}

// ErrorsView is a failed batch's errors, as OpenAI lists them.
type ErrorsView struct {
	Object string             `json:"object"`
	Data   []store.BatchError `json:"data"`
}

// ViewOf is b as OpenAI's batch object.
func ViewOf(b *store.Batch) View {
	v := View{ID: b.ID, Object: "batch", Endpoint: b.Endpoint, InputFileID: b.InputFileID,
		CompletionWindow: b.CompletionWindow, Status: b.Status, CreatedAt: b.CreatedAt.Unix(),
		InProgressAt: UnixOrNil(b.InProgressAt), ExpiresAt: UnixOrNil(b.ExpiresAt), FinalizingAt: UnixOrNil(b.FinalizingAt),
		CompletedAt: UnixOrNil(b.CompletedAt), FailedAt: UnixOrNil(b.FailedAt), ExpiredAt: UnixOrNil(b.ExpiredAt),
		CancellingAt: UnixOrNil(b.CancellingAt), CancelledAt: UnixOrNil(b.CancelledAt), RequestCounts: b.Counts,
		Metadata: b.Metadata}
	if len(b.Errors) > 0 {
		v.Errors = &ErrorsView{Object: "list", Data: b.Errors}
	}
	if v.Metadata == nil {
		v.Metadata = json.RawMessage("null")
	}
	if b.Status.Final() && b.Status != store.BatchFailed {
		if b.Counts.Completed > 0 {
			id := FileID(b.ID, OutputKind)
			v.OutputFileID = &id
		}
		if b.Counts.Failed > 0 {
			id := FileID(b.ID, ErrorsKind)
			v.ErrorFileID = &id
		}
	}
	return v
}

// UnixOrNil is t in Unix seconds, or nil (JSON null) when it has not happened.
func UnixOrNil(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	u := t.Unix()
	return &u
}

// The kinds of a batch's assembled files.
const (
	OutputKind = "output"
	ErrorsKind = "errors"
)

// FileID names a batch's output or error file.
func FileID(batchID, kind string) string {
	return "file-" + strings.TrimPrefix(batchID, "batch_") + "-" + kind
}

package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Files and batches: the OpenAI Files and Batches API on the operations engine
// (docs/batches.md). A batch's lines run as operations tagged with their batch and line; the
// batch's counts move in the same transaction as each line's final status, so a line is
// counted once whatever crashes, and the batch's own final status (with its event) is written
// by the transaction that settles its last line.

// File is an uploaded file; its content is kept in chunks beside it.
type File struct {
	ID        string    `json:"id"`
	Scope     string    `json:"scope"`
	Filename  string    `json:"filename"`
	Purpose   string    `json:"purpose"`
	Bytes     int64     `json:"bytes"`
	Lines     int       `json:"lines"` // newline-terminated lines, and a last one without
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// BatchStatus is where a batch is in its life (OpenAI's statuses).
type BatchStatus string

// The batch statuses. finalizing is passed through in the transaction that settles the last
// line: the output is assembled when read, so there is nothing to wait for.
const (
	BatchValidating BatchStatus = "validating"
	BatchFailed     BatchStatus = "failed"
	BatchInProgress BatchStatus = "in_progress"
	BatchFinalizing BatchStatus = "finalizing"
	BatchCompleted  BatchStatus = "completed"
	BatchExpired    BatchStatus = "expired"
	BatchCancelling BatchStatus = "cancelling"
	BatchCancelled  BatchStatus = "cancelled"
)

// Final reports whether s ends a batch's life.
func (s BatchStatus) Final() bool {
	return s == BatchFailed || s == BatchCompleted || s == BatchExpired || s == BatchCancelled
}

// BatchError is one reason a batch failed validation, naming its line (1-based) when it has one.
type BatchError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
	Line    int    `json:"line,omitempty"`
}

// BatchCounts are OpenAI's request_counts: completed lines succeeded, failed lines did not
// (failed upstream, canceled or expired).
type BatchCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// Batch is one batch: its input file's lines run as operations.
type Batch struct {
	ID               string          `json:"id"`
	Scope            string          `json:"scope"`
	Server           string          `json:"server,omitempty"`
	Endpoint         string          `json:"endpoint"`
	InputFileID      string          `json:"input_file_id"`
	CompletionWindow string          `json:"completion_window"`
	Status           BatchStatus     `json:"status"`
	Metadata         json.RawMessage `json:"metadata,omitempty"`
	Errors           []BatchError    `json:"errors,omitempty"`
	Counts           BatchCounts     `json:"counts"`
	// FileBytes are the sizes of the output and error files, counted as each line settles;
	// nil when some line was not counted so (docs/batches.md, Output and error files).
	FileBytes *BatchFileBytes `json:"file_bytes,omitempty"`
	// Created is how many line operations exist (lines 1..Created); they are created in chunks.
	Created int `json:"created"`
	// Expiring: the completion window passed; lines not started end expired.
	Expiring bool `json:"expiring,omitempty"`
	// Template is the creating request: each line is sent with its headers, host and address.
	Template *Request `json:"template,omitempty"`
	// Exec is how lines run (the creating block's async settings).
	Exec      *Execution    `json:"exec,omitempty"`
	Callback  *Callback     `json:"callback,omitempty"`
	Retention time.Duration `json:"retention"`

	CreatedAt    time.Time `json:"created_at"`
	InProgressAt time.Time `json:"in_progress_at,omitzero"`
	ExpiresAt    time.Time `json:"expires_at"`
	FinalizingAt time.Time `json:"finalizing_at,omitzero"`
	CompletedAt  time.Time `json:"completed_at,omitzero"`
	FailedAt     time.Time `json:"failed_at,omitzero"`
	ExpiredAt    time.Time `json:"expired_at,omitzero"`
	CancellingAt time.Time `json:"cancelling_at,omitzero"`
	CancelledAt  time.Time `json:"cancelled_at,omitzero"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// BatchFileBytes are the sizes of a batch's output and error files: each line's size is added
// in the transaction that counts it, so reading a file's size walks no line. A batch starts
// with them when its creator sets them; a writer that cannot size a line (no sizer installed,
// or a previous release, which drops the field when it rewrites the batch) leaves them nil for
// good, and the size is then found by assembling the file.
type BatchFileBytes struct {
	Output int64 `json:"output"`
	Errors int64 `json:"errors"`
}

// BatchLineSizer returns the bytes line operation op, just final with the upstream response
// res (nil when it has none), takes in its batch's output file (op succeeded) or error file;
// negative when it cannot tell.
type BatchLineSizer func(op *Operation, res *Response) int64

// BatchLine tags a line operation with its batch and line (1-based).
type BatchLine struct {
	Batch    string `json:"batch"`
	Line     int    `json:"line"`
	CustomID string `json:"custom_id"`
}

// FinishedAt is when b became final (zero before).
func (b *Batch) FinishedAt() time.Time {
	for _, t := range []time.Time{b.CompletedAt, b.FailedAt, b.ExpiredAt, b.CancelledAt} {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}

// PurgeAt is when a final batch is gone (zero before final).
func (b *Batch) PurgeAt() time.Time {
	if f := b.FinishedAt(); !f.IsZero() {
		return f.Add(b.Retention)
	}
	return time.Time{}
}

// Line error codes the gateway writes in the error file for lines that never ran.
const (
	LineCancelled = "batch_cancelled"
	LineExpired   = "batch_expired"
	// LineInputGone: the input file was gone (expired, or deleted) before the line was created.
	LineInputGone = "input_file_gone"
)

// LineOperationID is the id of batch's line operation: derived, so finding a line needs no
// index, and as unguessable as the batch id it extends.
func LineOperationID(batch string, line int) string {
	return fmt.Sprintf("op_%s_%07d", batch, line)
}

// BatchOfLine is the batch of line operation id, "" when id is not a line's.
func BatchOfLine(id string) string {
	rest, ok := strings.CutPrefix(id, "op_batch_")
	if !ok {
		return ""
	}
	if i := strings.LastIndexByte(rest, '_'); i > 0 {
		return "batch_" + rest[:i]
	}
	return ""
}

// Errors of files and batches.
var (
	// ErrTooLarge: an upload went over its limit; nothing of it is kept.
	ErrTooLarge = errors.New("file over the size limit")
	// ErrStale: lines were added from a position another writer already passed.
	ErrStale = errors.New("batch lines already created")
	// ErrFileQuota: an upload would take its scope over FileLimits.ScopeBytes or ScopeFiles;
	// nothing of it is kept.
	ErrFileQuota = errors.New("scope's stored files over their quota")
)

// FileLimits bound an upload (docs/batches.md, Scope and retention): its own size, and what
// its scope stores in all (files not yet expired, uploads in progress included). Zero means
// no bound.
type FileLimits struct {
	MaxBytes   int64 // the file's own size
	ScopeBytes int64 // the bytes of the scope's files together
	ScopeFiles int   // how many files the scope holds
}

// FileQuotaRoom checks that a scope holding files files of bytes bytes in all may take one more
// (adding, true) or add n bytes to one of its uploads (false). Both backends decide with it,
// under a per-scope lock taken before they count, so two uploads never both fit a room for one.
func FileQuotaRoom(lim FileLimits, files int, bytes, n int64, adding bool) error {
	if adding && lim.ScopeFiles > 0 && files >= lim.ScopeFiles {
		return ErrFileQuota
	}
	if lim.ScopeBytes > 0 && bytes+n > lim.ScopeBytes {
		return ErrFileQuota
	}
	return nil
}

// BatchAnnouncer returns the event announcing b's final status, or nil.
type BatchAnnouncer func(b *Batch) *Event

// Batches keeps files and batches.
type Batches interface {
	// CreateFile stores f with the content read from r, in chunks (never whole in memory); over
	// lim.MaxBytes it stores nothing and returns ErrTooLarge, and ErrFileQuota when f's scope
	// would go over its quota (FileQuotaRoom). f.Bytes and f.Lines are set. An upload counts
	// against its scope's quota from its first byte, until it is deleted or expires.
	CreateFile(f *File, r io.Reader, lim FileLimits) error
	// GetFile returns file id, or ErrNotFound (also once expired).
	GetFile(id string) (*File, error)
	// OpenFile streams file id's content.
	OpenFile(id string) (io.ReadCloser, error)
	// DeleteFile removes file id and its content; ErrNotFound when there is none.
	DeleteFile(id string) error
	// ListFiles returns scope's files newest first after the id `after`, at most limit, and
	// whether more follow.
	ListFiles(scope, after string, limit int) ([]*File, bool, error)
	// CreateBatch stores a new batch (validating).
	CreateBatch(b *Batch) error
	// GetBatch returns batch id, or ErrNotFound.
	GetBatch(id string) (*Batch, error)
	// ListBatches is ListFiles for batches.
	ListBatches(scope, after string, limit int) ([]*Batch, bool, error)
	// UpdateBatch applies fn to batch id in one transaction (fn may refuse with an error), then
	// settles it (SettleBatch), writing the announcer's event when it becomes final.
	UpdateBatch(id string, fn func(*Batch) error) (*Batch, error)
	// AddBatchLines stores line operations from+1.. of batch id with their requests, in one
	// transaction, only if exactly from lines exist (else ErrStale): each line is created once.
	// Lines of a batch no longer in progress are stored already final (CutLine); a line stored
	// final (its input gone) is counted at once and has no request.
	AddBatchLines(id string, from int, ops []*Operation, reqs []*Request) (*Batch, error)
	// UnsettledBatches returns the ids of batches not final, oldest first.
	UnsettledBatches() ([]string, error)
	// SetBatchAnnouncer installs the function whose event is written with a batch's final status.
	SetBatchAnnouncer(a BatchAnnouncer)
	// SetBatchLineSizer installs the function that sizes each line as it is counted
	// (Batch.FileBytes).
	SetBatchLineSizer(z BatchLineSizer)
	// SetBatchSettled installs fn, called with each batch that a transaction of this storage
	// made final, once that transaction has committed, by the handle that ran it: of all the
	// replicas on one storage exactly one hears of each batch, so what fn counts sums to one
	// per batch across them.
	SetBatchSettled(fn func(b *Batch))
}

// CutLine makes op, about to be stored for batch b, final at once when b no longer runs
// lines: cancelled, or expired (a line stored final already keeps its own error). It reports
// whether it did.
func CutLine(b *Batch, op *Operation, at time.Time) bool {
	if (b.Status == BatchInProgress && !b.Expiring) || op.Status.Final() {
		return false
	}
	code, msg := LineCancelled, "The batch was cancelled before this request ran."
	if b.Expiring {
		code, msg = LineExpired, "This request could not be executed before the completion window expired."
	}
	op.Status, op.FinishedAt, op.UpdatedAt = StatusCanceled, at, at
	op.Error = &OperationError{Code: code, Message: msg}
	return true
}

// CountLine counts line operation op, just final with the upstream response res (nil without
// one), into its batch b, and adds its size (sized by size) to b's file sizes.
func CountLine(b *Batch, op *Operation, res *Response, size *BatchLineSizer) {
	ok := op.Status == StatusSucceeded
	if ok {
		b.Counts.Completed++
	} else {
		b.Counts.Failed++
	}
	if b.FileBytes == nil {
		return
	}
	n := int64(-1)
	if size != nil && *size != nil {
		n = (*size)(op, res)
	}
	switch {
	case n < 0:
		b.FileBytes = nil // unknown from now on: the file is assembled to size it
	case ok:
		b.FileBytes.Output += n
	default:
		b.FileBytes.Errors += n
	}
}

// UpdateBatchWith is the decision of Batches.UpdateBatch, which each backend runs under the
// batch's lock: fn applied to b, then b stamped at and settled. A final batch is left as it is
// and fn not called; changed reports whether b is to be written. fn's error is returned as it
// is: it is the caller's answer.
func UpdateBatchWith(b *Batch, at time.Time, fn func(*Batch) error) (changed bool, err error) {
	if b.Status.Final() {
		return false, nil
	}
	if err := fn(b); err != nil {
		return false, err
	}
	b.UpdatedAt = at
	SettleBatch(b, at)
	return true, nil
}

// SettleBatch makes b final when every line exists and is final: completed, cancelled or
// expired as it was going. It reports whether b became final.
func SettleBatch(b *Batch, at time.Time) bool {
	c := b.Counts
	if b.Status.Final() || b.Status == BatchValidating || b.Created < c.Total || c.Completed+c.Failed < c.Total {
		return false
	}
	b.FinalizingAt, b.UpdatedAt = at, at
	switch {
	case b.Status == BatchCancelling:
		b.Status, b.CancelledAt = BatchCancelled, at
	case b.Expiring:
		b.Status, b.ExpiredAt = BatchExpired, at
	default:
		b.Status, b.CompletedAt = BatchCompleted, at
	}
	return true
}

// LineRequest is the request line `line` of batch b sends: the creator's headers, the line's
// method, URL and body.
func LineRequest(b *Batch, method, url string, body []byte) *Request {
	t := b.Template
	if t == nil {
		t = &Request{Header: http.Header{}}
	}
	return &Request{Method: method, URL: url, Host: t.Host, Proto: t.Proto, RemoteAddr: t.RemoteAddr,
		Header: t.Header.Clone(), Body: body}
}

// ChunkReader reads a stored file's chunks in order, each fetched by Chunk when the one before
// is used up: Chunk returns chunk seq (from 0), or ok false after the last one. Both backends
// open files with it.
type ChunkReader struct {
	Chunk func(seq int) (data []byte, ok bool, err error)
	seq   int
	buf   []byte
}

func (c *ChunkReader) Read(p []byte) (int, error) {
	if len(c.buf) == 0 {
		data, ok, err := c.Chunk(c.seq)
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, io.EOF
		}
		c.buf, c.seq = data, c.seq+1
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

package module

import (
	"errors"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/batches"
	"github.com/mulligan-gw/mulligan/store"
)

// The Files API (docs/batches.md): uploads stream into the storage in chunks, downloads stream
// out of it; a batch's output and error files are assembled from its lines when read.

// purposeBatch is the one file purpose served: files are a batch's input.
const purposeBatch = "batch"

// fileView is OpenAI's file object.
type fileView struct {
	ID            string  `json:"id"`
	Object        string  `json:"object"`
	Bytes         int64   `json:"bytes"`
	CreatedAt     int64   `json:"created_at"`
	ExpiresAt     *int64  `json:"expires_at"`
	Filename      string  `json:"filename"`
	Purpose       string  `json:"purpose"`
	Status        string  `json:"status"`
	StatusDetails *string `json:"status_details"`
}

func viewOfFile(f *store.File) fileView {
	return fileView{ID: f.ID, Object: "file", Bytes: f.Bytes, CreatedAt: f.CreatedAt.Unix(), ExpiresAt: batches.UnixOrNil(f.ExpiresAt),
		Filename: f.Filename, Purpose: f.Purpose, Status: "processed"}
}

// listView is OpenAI's list object.
type listView[T any] struct {
	Object  string  `json:"object"`
	Data    []T     `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

func listOf[T any](data []T, id func(T) string, more bool) listView[T] {
	l := listView[T]{Object: "list", Data: data, HasMore: more}
	if l.Data == nil {
		l.Data = []T{}
	}
	if len(data) > 0 {
		first, last := id(data[0]), id(data[len(data)-1])
		l.FirstID, l.LastID = &first, &last
	}
	return l
}

// Bounds of an upload beside max_file_size (docs/batches.md, Files): what a client sends around
// the file is small, so a body that is mostly something else is refused before it is read.
const (
	// uploadOverhead is what an upload's body may hold beyond the file's bytes: the part
	// headers, the purpose field and the boundaries.
	uploadOverhead = 64 << 10
	// maxUploadParts bounds the parts of an upload (the SDKs send two: file and purpose).
	maxUploadParts = 16
	// maxFilename bounds the file's name, in bytes, as stored and shown.
	maxFilename = 255
)

// uploadFile stores a multipart upload's "file" part as it arrives; its "purpose" must be batch.
// The body is bounded by max_file_size plus uploadOverhead, and its parts by maxUploadParts.
func (a *batchCall) uploadFile() {
	a.r.Body = http.MaxBytesReader(a.w, a.r.Body, min(a.cfg.MaxFileSize, math.MaxInt64-uploadOverhead)+uploadOverhead)
	mr, err := a.r.MultipartReader()
	if err != nil {
		a.invalid("Send the file as multipart/form-data with the fields file and purpose.", "file")
		return
	}
	now := a.now
	f := &store.File{ID: newID("file-", now), Scope: a.scope, Purpose: purposeBatch, CreatedAt: now, ExpiresAt: now.Add(a.retention)}
	purpose, stored := "", false
	for parts := 0; ; parts++ {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err == nil && parts == maxUploadParts {
			err = errTooManyParts
		}
		if err != nil {
			a.dropUpload(f, stored)
			a.unreadable(err)
			return
		}
		switch part.FormName() {
		case "purpose":
			purpose = readField(part)
		case "file":
			if stored {
				a.invalid("Send one file per upload.", "file")
				a.dropUpload(f, stored)
				return
			}
			if f.Filename = part.FileName(); len(f.Filename) > maxFilename {
				a.invalid("The file's name is over "+strconv.Itoa(maxFilename)+" bytes.", "file")
				return
			}
			if !a.storeUpload(f, part) {
				return
			}
			stored = true
		}
	}
	a.finishUpload(f, purpose, stored)
}

// errTooManyParts refuses an upload of more parts than maxUploadParts.
var errTooManyParts = errors.New("too many parts")

// unreadable answers an upload whose multipart body could not be read: over its size bound,
// over maxUploadParts, or malformed.
func (a *batchCall) unreadable(err error) {
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		a.openAIError(apierr.Error{Code: apierr.CodeRequestTooLarge, Param: param("file"),
			Message: "The upload is over max_file_size (" + strconv.FormatInt(a.cfg.MaxFileSize, 10) + " bytes) and its form fields."})
		return
	}
	if errors.Is(err, errTooManyParts) {
		a.invalid("The upload has more than "+strconv.Itoa(maxUploadParts)+" parts; send the fields file and purpose.", "file")
		return
	}
	a.invalid("The multipart body could not be read.", "file")
}

// readField reads a small form field.
func readField(p *multipart.Part) string {
	b, _ := io.ReadAll(io.LimitReader(p, 256))
	return strings.TrimSpace(string(b))
}

// storeUpload streams part into storage; false when it answered a failure.
func (a *batchCall) storeUpload(f *store.File, part io.Reader) bool {
	err := a.st.CreateFile(f, part, a.cfg.fileLimits())
	switch {
	case errors.Is(err, store.ErrTooLarge):
		a.openAIError(apierr.Error{Code: apierr.CodeRequestTooLarge, Param: param("file"),
			Message: "The file is over max_file_size (" + strconv.FormatInt(a.cfg.MaxFileSize, 10) + " bytes)."})
		return false
	case errors.Is(err, store.ErrFileQuota):
		a.openAIError(apierr.Error{Code: apierr.CodeFileQuota, Param: param("file"),
			Message: "The files stored in your scope would be over its quota (" + strconv.Itoa(a.cfg.MaxScopeFiles) + " files, " +
				strconv.FormatInt(a.cfg.MaxScopeBytes, 10) + " bytes together); delete files you no longer need, or wait for them to expire.",
			Details: map[string]any{"max_scope_files": a.cfg.MaxScopeFiles, "max_scope_bytes": a.cfg.MaxScopeBytes}})
		return false
	case errors.Is(err, store.ErrUnavailable):
		a.fail(err)
		return false
	case errors.As(err, new(*http.MaxBytesError)):
		a.unreadable(err)
		return false
	case err != nil:
		a.invalid("The file could not be read: "+err.Error(), "file")
		return false
	}
	return true
}

// finishUpload answers an upload whose parts were all read. The official SDKs send the purpose
// after the file, so the file is stored as a batch file as it arrives, and dropped when the
// purpose then turns out to be another.
func (a *batchCall) finishUpload(f *store.File, purpose string, stored bool) {
	switch {
	case !stored:
		a.invalid("The upload has no file field.", "file")
	case purpose != purposeBatch:
		a.dropUpload(f, stored)
		a.invalid("Only purpose \"batch\" is served here; got \""+purpose+"\".", "purpose")
	default:
		batches.CountUploaded()
		writeJSON(a.w, http.StatusOK, viewOfFile(f))
	}
}

func (a *batchCall) dropUpload(f *store.File, stored bool) {
	if stored {
		if err := a.st.DeleteFile(f.ID); err != nil {
			a.log.Warn("dropping a refused upload", zap.String("file_id", f.ID), zap.Error(err))
		}
	}
}

// getFile answers a file object: an uploaded file, or a batch's output or error file.
func (a *batchCall) getFile(id string) {
	if b, kind, ok := a.outputOf(id); ok {
		if b == nil {
			return
		}
		n, err := batches.FileBytes(a.st, b, kind == batches.OutputKind)
		if err != nil {
			a.fail(err)
			return
		}
		writeJSON(a.w, http.StatusOK, fileView{ID: id, Object: "file", Bytes: n, CreatedAt: b.FinishedAt().Unix(),
			ExpiresAt: batches.UnixOrNil(b.PurgeAt()), Filename: b.ID + "_" + kind + ".jsonl", Purpose: "batch_" + kind, Status: "processed"})
		return
	}
	if f := a.loadFile(id); f != nil {
		writeJSON(a.w, http.StatusOK, viewOfFile(f))
	}
}

// fileContent streams a file's content: an upload from its chunks, an output or error file
// assembled line by line from the batch's line operations.
func (a *batchCall) fileContent(id string) {
	if b, kind, ok := a.outputOf(id); ok {
		if b != nil {
			a.w.Header().Set("Content-Type", "application/jsonl")
			a.w.WriteHeader(http.StatusOK)
			if _, err := batches.WriteLines(a.w, a.st, b, kind == batches.OutputKind); err != nil {
				a.log.Error("assembling a batch's file", zap.String("batch_id", b.ID), zap.Error(err))
				panic(http.ErrAbortHandler) // the client must not take a cut file for a whole one
			}
		}
		return
	}
	if a.loadFile(id) == nil {
		return
	}
	rc, err := a.st.OpenFile(id)
	if err != nil {
		a.fail(err)
		return
	}
	defer rc.Close()
	a.w.Header().Set("Content-Type", "application/octet-stream")
	a.w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(a.w, rc); err != nil {
		a.log.Warn("streaming a file", zap.String("file_id", id), zap.Error(err))
		panic(http.ErrAbortHandler)
	}
}

// deleteFile removes an uploaded file (a batch's output goes with its batch).
func (a *batchCall) deleteFile(id string) {
	if _, _, ok := a.outputOf(id); ok {
		a.invalid("A batch's output and error files go with the batch; they cannot be deleted alone.", "file_id")
		return
	}
	if a.loadFile(id) == nil {
		return
	}
	if batch, err := a.batchReading(id); err != nil || batch != "" {
		if err != nil {
			a.fail(err)
			return
		}
		a.invalid("File "+id+" is the input of batch "+batch+", which is not finished; delete it once the batch ends.", "file_id")
		return
	}
	if err := a.st.DeleteFile(id); err != nil && !errors.Is(err, store.ErrNotFound) {
		a.fail(err)
		return
	}
	writeJSON(a.w, http.StatusOK, map[string]any{"id": id, "object": "file", "deleted": true})
}

// listFiles answers the caller's files, newest first; none for an anonymous caller.
func (a *batchCall) listFiles() {
	after, limit, ok := a.paging(10000)
	if !ok {
		return
	}
	var files []*store.File
	var more bool
	if !a.anonymous {
		var err error
		if files, more, err = a.st.ListFiles(a.scope, after, limit); err != nil {
			a.fail(err)
			return
		}
	}
	views := make([]fileView, 0, len(files))
	for _, f := range files {
		views = append(views, viewOfFile(f))
	}
	writeJSON(a.w, http.StatusOK, listOf(views, func(v fileView) string { return v.ID }, more))
}

// loadFile returns the caller's file id, or answers 404: another scope's file is missing.
func (a *batchCall) loadFile(id string) *store.File {
	f, err := a.st.GetFile(id)
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && (f.Scope != a.scope || !a.now.Before(f.ExpiresAt))):
		a.openAIError(apierr.Error{Code: apierr.CodeFileNotFound, Param: param("file_id"), Message: "No such File object: " + id})
		return nil
	case err != nil:
		a.fail(err)
		return nil
	}
	return f
}

// batchReading returns the batch not yet final whose input is file id, or "": such a file is
// pinned (docs/batches.md), as the batch reads its lines again until every one is created.
// Unfinished batches are few (each holds a file of up to max_requests lines), so a scan is cheap.
func (a *batchCall) batchReading(id string) (string, error) {
	ids, err := a.st.UnsettledBatches()
	if err != nil {
		return "", err
	}
	for _, bid := range ids {
		b, err := a.st.GetBatch(bid)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return "", err
		}
		if b.InputFileID == id && !b.Status.Final() {
			return b.ID, nil
		}
	}
	return "", nil
}

package batches

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

// viewOfFile is f as OpenAI's file object.
func viewOfFile(f *store.File) fileView {
	return fileView{ID: f.ID, Object: "file", Bytes: f.Bytes, CreatedAt: f.CreatedAt.Unix(), ExpiresAt: UnixOrNil(f.ExpiresAt),
		Filename: f.Filename, Purpose: f.Purpose, Status: "processed"}
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

// UploadFile stores a multipart upload's "file" part as it arrives; its "purpose" must be batch.
// The body is bounded by max_file_size plus uploadOverhead, and its parts by maxUploadParts.
func (a *Call) UploadFile() {
	a.r.Body = http.MaxBytesReader(a.w, a.r.Body, min(a.api.Config.MaxFileSize, math.MaxInt64-uploadOverhead)+uploadOverhead)
	mr, err := a.r.MultipartReader()
	if err != nil {
		a.invalid("Send the file as multipart/form-data with the fields file and purpose.", "file")
		return
	}
	now := a.now
	f := &store.File{ID: a.api.NewID("file-", now), Scope: a.Scope, Purpose: purposeBatch, CreatedAt: now, ExpiresAt: now.Add(a.api.Retention)}
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
func (a *Call) unreadable(err error) {
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		a.Error(apierr.Error{Code: apierr.CodeRequestTooLarge, Param: param("file"),
			Message: "The upload is over max_file_size (" + strconv.FormatInt(a.api.Config.MaxFileSize, 10) + " bytes) and its form fields."})
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
func (a *Call) storeUpload(f *store.File, part io.Reader) bool {
	err := a.api.Store.CreateFile(f, part, a.api.Config.fileLimits())
	switch {
	case errors.Is(err, store.ErrTooLarge):
		a.Error(apierr.Error{Code: apierr.CodeRequestTooLarge, Param: param("file"),
			Message: "The file is over max_file_size (" + strconv.FormatInt(a.api.Config.MaxFileSize, 10) + " bytes)."})
		return false
	case errors.Is(err, store.ErrFileQuota):
		a.Error(apierr.Error{Code: apierr.CodeFileQuota, Param: param("file"),
			Message: "The files stored in your scope would be over its quota (" + strconv.Itoa(a.api.Config.MaxScopeFiles) + " files, " +
				strconv.FormatInt(a.api.Config.MaxScopeBytes, 10) + " bytes together); delete files you no longer need, or wait for them to expire.",
			Details: map[string]any{"max_scope_files": a.api.Config.MaxScopeFiles, "max_scope_bytes": a.api.Config.MaxScopeBytes}})
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
func (a *Call) finishUpload(f *store.File, purpose string, stored bool) {
	switch {
	case !stored:
		a.invalid("The upload has no file field.", "file")
	case purpose != purposeBatch:
		a.dropUpload(f, stored)
		a.invalid("Only purpose \"batch\" is served here; got \""+purpose+"\".", "purpose")
	default:
		CountUploaded()
		apierr.WriteJSON(a.w, http.StatusOK, viewOfFile(f))
	}
}

func (a *Call) dropUpload(f *store.File, stored bool) {
	if stored {
		if err := a.api.Store.DeleteFile(f.ID); err != nil {
			a.api.Log.Warn("dropping a refused upload", zap.String("file_id", f.ID), zap.Error(err))
		}
	}
}

// GetFile answers a file object: an uploaded file, or a batch's output or error file.
func (a *Call) GetFile(id string) {
	if b, kind, ok := a.outputOf(id); ok {
		if b == nil {
			return
		}
		n, err := FileBytes(a.api.Store, b, kind == OutputKind)
		if err != nil {
			a.fail(err)
			return
		}
		apierr.WriteJSON(a.w, http.StatusOK, fileView{ID: id, Object: "file", Bytes: n, CreatedAt: b.FinishedAt().Unix(),
			ExpiresAt: UnixOrNil(b.PurgeAt()), Filename: b.ID + "_" + kind + ".jsonl", Purpose: "batch_" + kind, Status: "processed"})
		return
	}
	if f := a.loadFile(id); f != nil {
		apierr.WriteJSON(a.w, http.StatusOK, viewOfFile(f))
	}
}

// FileContent streams a file's content: an upload from its chunks, an output or error file
// assembled line by line from the batch's line operations.
func (a *Call) FileContent(id string) {
	if b, kind, ok := a.outputOf(id); ok {
		if b != nil {
			a.w.Header().Set("Content-Type", "application/jsonl")
			a.w.WriteHeader(http.StatusOK)
			if _, err := WriteLines(a.w, a.api.Store, b, kind == OutputKind); err != nil {
				a.api.Log.Error("assembling a batch's file", zap.String("batch_id", b.ID), zap.Error(err))
				panic(http.ErrAbortHandler) // the client must not take a cut file for a whole one
			}
		}
		return
	}
	if a.loadFile(id) == nil {
		return
	}
	rc, err := a.api.Store.OpenFile(id)
	if err != nil {
		a.fail(err)
		return
	}
	defer rc.Close()
	a.w.Header().Set("Content-Type", "application/octet-stream")
	a.w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(a.w, rc); err != nil {
		a.api.Log.Warn("streaming a file", zap.String("file_id", id), zap.Error(err))
		panic(http.ErrAbortHandler)
	}
}

// DeleteFile removes an uploaded file (a batch's output goes with its batch).
func (a *Call) DeleteFile(id string) {
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
	if err := a.api.Store.DeleteFile(id); err != nil && !errors.Is(err, store.ErrNotFound) {
		a.fail(err)
		return
	}
	apierr.WriteJSON(a.w, http.StatusOK, map[string]any{"id": id, "object": "file", "deleted": true})
}

// ListFiles answers the caller's files, newest first; none for an anonymous caller.
func (a *Call) ListFiles() {
	answerList(a, 10000, a.api.Store.ListFiles, viewOfFile, func(v fileView) string { return v.ID })
}

// loadFile returns the caller's file id, or answers 404: another scope's file is missing.
func (a *Call) loadFile(id string) *store.File {
	f, err := a.api.Store.GetFile(id)
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && (f.Scope != a.Scope || !a.now.Before(f.ExpiresAt))):
		a.Error(apierr.Error{Code: apierr.CodeFileNotFound, Param: param("file_id"), Message: "No such File object: " + id})
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
func (a *Call) batchReading(id string) (string, error) {
	ids, err := a.api.Store.UnsettledBatches()
	if err != nil {
		return "", err
	}
	for _, bid := range ids {
		b, err := a.api.Store.GetBatch(bid)
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

package batches

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/store"
)

// The Batches API (docs/batches.md): a batch is validated, then its lines run as operations.

// batchRequest is the body of POST {prefix}/
type batchRequest struct {
	InputFileID      string          `json:"input_file_id"`
	Endpoint         string          `json:"endpoint"`
	CompletionWindow string          `json:"completion_window"`
	Metadata         json.RawMessage `json:"metadata"`
}

// completion windows accepted: OpenAI's 24h, or any duration in this range (docs/batches.md).
const (
	minCompletionWindow = time.Second
	maxCompletionWindow = 7 * 24 * time.Hour
)

// CreateBatch stores a new batch, validating; the batch worker validates its file.
func (a *Call) CreateBatch() {
	var req batchRequest
	if err := json.NewDecoder(io.LimitReader(a.r.Body, 1<<20)).Decode(&req); err != nil {
		a.invalid("The body must be a JSON object with input_file_id, endpoint and completion_window.", "")
		return
	}
	window, ok := a.checkBatchRequest(&req)
	if !ok {
		return
	}
	f := a.loadFile(req.InputFileID)
	if f == nil {
		return
	}
	if !a.checkInputFile(f) {
		return
	}
	// The callback is resolved last, so a refused Callback-Url is answered only for a create
	// that is otherwise sound.
	o, ok := a.api.Origin(a.w, a.r)
	if !ok {
		return
	}
	b := a.newBatch(&req, window, o)
	if err := a.api.Store.CreateBatch(b); err != nil {
		a.fail(err)
		return
	}
	CountCreated()
	a.api.Log.Info("batch created", zap.String("batch_id", b.ID), zap.String("input_file_id", b.InputFileID), zap.Int("lines", f.Lines))
	a.api.Worker.Kick()
	apierr.WriteJSON(a.w, http.StatusOK, ViewOf(b))
}

// checkBatchRequest refuses a malformed create with OpenAI's shape and returns the window.
func (a *Call) checkBatchRequest(req *batchRequest) (time.Duration, bool) {
	if req.InputFileID == "" {
		a.invalid("Missing required parameter: 'input_file_id'.", "input_file_id")
		return 0, false
	}
	if !a.api.Config.ServesEndpoint(req.Endpoint) {
		a.invalid("endpoint must be the path each line is sent to, under "+a.api.Config.Prefix+"/ and outside its files and batches, written plainly, such as "+a.api.Config.Prefix+"/chat/completions.", "endpoint")
		return 0, false
	}
	window, err := time.ParseDuration(req.CompletionWindow)
	if err != nil || window < minCompletionWindow || window > maxCompletionWindow {
		a.invalid("completion_window must be a duration such as 24h (at most 168h).", "completion_window")
		return 0, false
	}
	if len(req.Metadata) > 0 && (req.Metadata[0] != '{' && string(req.Metadata) != "null" || len(req.Metadata) > metadataLimit) {
		a.invalid("metadata must be an object of at most 16 string pairs.", "metadata")
		return 0, false
	}
	return window, true
}

// metadataLimit bounds a batch's metadata (OpenAI: 16 pairs of short strings).
const metadataLimit = 4096

// checkInputFile refuses an input file that is not a batch file or has too many lines.
func (a *Call) checkInputFile(f *store.File) bool {
	switch {
	case f.Purpose != purposeBatch:
		a.invalid("The input file's purpose must be batch.", "input_file_id")
	case f.Lines == 0:
		a.invalid("The input file is empty.", "input_file_id")
	case f.Lines > a.api.Config.MaxRequests:
		a.invalid("The input file has more lines than max_requests allows.", "input_file_id")
	default:
		return true
	}
	return false
}

// newBatch is the batch req creates, not stored yet: its lines will be sent with the creator's
// credentials (lineHeaders) to the same server, with the block's async settings.
func (a *Call) newBatch(req *batchRequest, window time.Duration, o Origin) *store.Batch {
	now := a.now
	h := a.lineHeaders()
	b := &store.Batch{ID: a.api.NewID("batch_", now), Scope: a.Scope, Endpoint: req.Endpoint, InputFileID: req.InputFileID,
		CompletionWindow: req.CompletionWindow, Status: store.BatchValidating, CreatedAt: now, UpdatedAt: now,
		ExpiresAt: now.Add(window), Retention: a.api.Retention, Callback: o.Callback, Exec: o.Exec, Server: o.Server,
		FileBytes: &store.BatchFileBytes{}, // sized from its first line (lineBytes)
		Template:  &store.Request{Host: a.r.Host, Proto: a.r.Proto, RemoteAddr: a.r.RemoteAddr, Header: h}}
	if string(req.Metadata) != "null" {
		b.Metadata = req.Metadata
	}
	return b
}

// findBatch returns the caller's batch id; nil (and no error) when it is missing or another
// scope's.
func (a *Call) findBatch(id string) (*store.Batch, error) {
	b, err := a.api.Store.GetBatch(id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && b.Scope != a.Scope) {
		return nil, nil
	}
	return b, err
}

// loadBatch returns the caller's batch id, or answers 404 (the same for another scope's).
func (a *Call) loadBatch(id string) *store.Batch {
	b, err := a.findBatch(id)
	switch {
	case err != nil:
		a.fail(err)
	case b == nil:
		a.Error(apierr.Error{Code: apierr.CodeBatchNotFound, Param: param("batch_id"), Message: "No such Batch object: " + id})
	}
	return b
}

// GetBatch answers the caller's batch id.
func (a *Call) GetBatch(id string) {
	if b := a.loadBatch(id); b != nil {
		apierr.WriteJSON(a.w, http.StatusOK, ViewOf(b))
	}
}

// ListBatches answers the caller's batches, newest first; none for an anonymous caller.
func (a *Call) ListBatches() {
	answerList(a, 100, a.api.Store.ListBatches, ViewOf, func(v View) string { return v.ID })
}

// CancelBatch moves a batch to cancelling; the batch worker stops its lines and the last one
// settles it cancelled.
func (a *Call) CancelBatch(id string) {
	if a.loadBatch(id) == nil {
		return
	}
	b, err := a.api.Store.UpdateBatch(id, func(b *store.Batch) error {
		if b.Status != store.BatchCancelling {
			b.Status, b.CancellingAt = store.BatchCancelling, a.now
		}
		return nil
	})
	if err != nil {
		a.fail(err)
		return
	}
	if b.Status.Final() && b.Status != store.BatchCancelled {
		a.Error(apierr.Error{Code: apierr.CodeBatchAlreadyFinal, Param: param("batch_id"),
			Message: "Cannot cancel a batch with status " + string(b.Status) + "."})
		return
	}
	a.api.Log.Info("batch cancelling", zap.String("batch_id", id))
	a.api.Worker.Kick()
	apierr.WriteJSON(a.w, http.StatusOK, ViewOf(b))
}

// lineHeaders are the creator's headers every line carries: an allow-list (docs/batches.md) of
// what identifies and shapes an OpenAI call (Authorization, Accept, User-Agent, OpenAI-*), and
// the headers the block's scope reads, so a line is scoped and authorized as its creator; never
// cookies, X-Forwarded-*, Expect or Content-Encoding, which belonged to the create call alone.
func (a *Call) lineHeaders() http.Header {
	scope := strings.ToLower(a.api.Scope)
	h := http.Header{}
	for name, values := range a.r.Header {
		switch {
		case name == "Authorization", name == "Accept", name == "User-Agent", strings.HasPrefix(name, "Openai-"),
			strings.Contains(scope, "{http.request.header."+strings.ToLower(name)+"}"):
			h[name] = slices.Clone(values)
		}
	}
	h.Set("Content-Type", "application/json")
	return h
}

// outputOf reports whether id names a batch's output or error file (ok), and returns the
// batch when it is the caller's and final; otherwise it has answered 404 and b is nil.
func (a *Call) outputOf(id string) (b *store.Batch, kind string, ok bool) {
	rest, found := strings.CutPrefix(id, "file-")
	if !found {
		return nil, "", false
	}
	for _, k := range []string{OutputKind, ErrorsKind} {
		if base, cut := strings.CutSuffix(rest, "-"+k); cut {
			b, err := a.findBatch("batch_" + base)
			switch {
			case err != nil && !errors.Is(err, store.ErrNotFound):
				a.fail(err)
				return nil, k, true
			case b == nil || !b.Status.Final():
				a.Error(apierr.Error{Code: apierr.CodeFileNotFound, Param: param("file_id"), Message: "No such File object: " + id})
				return nil, k, true
			}
			return b, k, true
		}
	}
	return nil, "", false
}

package module

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/batches"
	"github.com/mulligan-gw/mulligan/store"
)

// batchCall is one call of the Files or Batches API, matched to the caller's scope.
type batchCall struct {
	h    *Handler
	w    http.ResponseWriter
	r    *http.Request
	st   store.Backend
	run  *runner
	work *batches.Worker
	cfg  *BatchesConfig
	// caller: an anonymous one (no credentials) lists nothing, as in the operations API, and
	// reaches only the files and batches whose ids it was given.
	caller
	retention time.Duration
	now       time.Time
	log       *zap.Logger
}

// serveBatchesAPI routes the Files and Batches API (docs/batches.md):
//
//	POST   {prefix}/files                 upload (multipart: file, purpose=batch)
//	GET    {prefix}/files                 the caller's files
//	GET    {prefix}/files/{id}            one file
//	GET    {prefix}/files/{id}/content    its content
//	DELETE {prefix}/files/{id}            delete it
//	POST   {prefix}/batches               create a batch
//	GET    {prefix}/batches               the caller's batches
//	GET    {prefix}/batches/{id}          one batch
//	POST   {prefix}/batches/{id}/cancel   cancel it
func (h *Handler) serveBatchesAPI(w http.ResponseWriter, r *http.Request) {
	s, done, err := h.storage.acquire()
	if err != nil {
		h.storageFailed(w, err)
		return
	}
	defer done()
	a := &batchCall{h: h, w: w, r: r, st: s.be, run: s.run, work: s.batches, cfg: h.Batches,
		caller: h.callerOf(r), retention: time.Duration(h.Async.Retention), now: h.now(),
		log: h.logger.With(zap.String("request_id", w.Header().Get(headerRequestID)))}
	rest := strings.TrimPrefix(r.URL.Path, h.Batches.Prefix+"/")
	kind, rest, _ := strings.Cut(rest, "/")
	id, action, _ := strings.Cut(rest, "/")
	if kind == "files" {
		a.routeFiles(id, action)
	} else {
		a.routeBatches(id, action)
	}
}

func (a *batchCall) routeFiles(id, action string) {
	m := a.r.Method
	switch {
	case id == "" && m == http.MethodPost:
		a.uploadFile()
	case id == "" && m == http.MethodGet:
		a.listFiles()
	case id == "":
		a.notAllowed("GET, POST")
	case action == "" && m == http.MethodGet:
		a.getFile(id)
	case action == "" && m == http.MethodDelete:
		a.deleteFile(id)
	case action == "":
		a.notAllowed("GET, DELETE")
	case action == "content" && m == http.MethodGet:
		a.fileContent(id)
	case action == "content":
		a.notAllowed("GET")
	default:
		a.openAIError(apierr.Error{Code: apierr.CodeFileNotFound, Message: "No such route: " + a.r.URL.Path})
	}
}

func (a *batchCall) routeBatches(id, action string) {
	m := a.r.Method
	switch {
	case id == "" && m == http.MethodPost:
		a.createBatch()
	case id == "" && m == http.MethodGet:
		a.listBatches()
	case id == "":
		a.notAllowed("GET, POST")
	case action == "" && m == http.MethodGet:
		a.getBatch(id)
	case action == "":
		a.notAllowed("GET")
	case action == "cancel" && m == http.MethodPost:
		a.cancelBatch(id)
	case action == "cancel":
		a.notAllowed("POST")
	default:
		a.openAIError(apierr.Error{Code: apierr.CodeBatchNotFound, Message: "No such route: " + a.r.URL.Path})
	}
}

// openAIError answers e through the one error writer, with OpenAI's type beside the
// gateway's fields, so the official SDKs raise their own error classes (docs/batches.md).
func (a *batchCall) openAIError(e apierr.Error) {
	if e.Type == "" {
		e.Type = "invalid_request_error"
		if apierr.Status(e.Code) >= 500 {
			e.Type = "server_error"
		}
	}
	apierr.Write(a.w, e)
}

func (a *batchCall) invalid(message, p string) {
	a.openAIError(apierr.Error{Code: apierr.CodeInvalidRequest, Message: message, Param: param(p)})
}

func (a *batchCall) notAllowed(allow string) {
	a.w.Header().Set("Allow", allow)
	a.openAIError(apierr.Error{Code: apierr.CodeMethodNotAllowed, Message: "Use " + allow + " here."})
}

func (a *batchCall) fail(err error) {
	a.log.Error("storage unavailable", zap.Error(err))
	a.openAIError(apierr.Error{Code: apierr.CodeStorage, Message: "The gateway's storage is unavailable; retry shortly.", RetryAfter: time.Second})
}

func param(p string) *string {
	if p == "" {
		return nil
	}
	return &p
}

// paging reads OpenAI's `after` and `limit` (1..max, default 20).
func (a *batchCall) paging(max int) (after string, limit int, ok bool) {
	q := a.r.URL.Query()
	limit = 20
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > max {
			a.invalid("limit must be a whole number from 1 to "+strconv.Itoa(max)+".", "limit")
			return "", 0, false
		}
		limit = n
	}
	return q.Get("after"), limit, true
}

// outputOf reports whether id names a batch's output or error file (ok), and returns the
// batch when it is the caller's and final; otherwise it has answered 404 and b is nil.
func (a *batchCall) outputOf(id string) (b *store.Batch, kind string, ok bool) {
	rest, found := strings.CutPrefix(id, "file-")
	if !found {
		return nil, "", false
	}
	for _, k := range []string{batches.OutputKind, batches.ErrorsKind} {
		if base, cut := strings.CutSuffix(rest, "-"+k); cut {
			b, err := a.findBatch("batch_" + base)
			switch {
			case err != nil && !errors.Is(err, store.ErrNotFound):
				a.fail(err)
				return nil, k, true
			case b == nil || !b.Status.Final():
				a.openAIError(apierr.Error{Code: apierr.CodeFileNotFound, Param: param("file_id"), Message: "No such File object: " + id})
				return nil, k, true
			}
			return b, k, true
		}
	}
	return nil, "", false
}

package module

import (
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/batches"
)

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
	api := &batches.API{Store: s.be, Worker: s.batches, Clock: h.clock, Config: h.Batches.api(),
		Retention: time.Duration(h.Async.Retention), Scope: h.Scope, NewID: newID, Origin: h.batchOrigin,
		Log: h.logger.With(zap.String("request_id", w.Header().Get(headerRequestID)))}
	c := h.callerOf(r)
	a := api.Call(w, r, batches.Caller{Scope: c.scope, Anonymous: c.anonymous})
	rest := strings.TrimPrefix(r.URL.Path, h.Batches.Prefix+"/")
	kind, rest, _ := strings.Cut(rest, "/")
	id, action, _ := strings.Cut(rest, "/")
	if kind == "files" {
		routeFiles(a, r, id, action)
	} else {
		routeBatches(a, r, id, action)
	}
}

func routeFiles(a *batches.Call, r *http.Request, id, action string) {
	m := r.Method
	switch {
	case id == "" && m == http.MethodPost:
		a.UploadFile()
	case id == "" && m == http.MethodGet:
		a.ListFiles()
	case id == "":
		a.NotAllowed("GET, POST")
	case action == "" && m == http.MethodGet:
		a.GetFile(id)
	case action == "" && m == http.MethodDelete:
		a.DeleteFile(id)
	case action == "":
		a.NotAllowed("GET, DELETE")
	case action == "content" && m == http.MethodGet:
		a.FileContent(id)
	case action == "content":
		a.NotAllowed("GET")
	default:
		a.Error(apierr.Error{Code: apierr.CodeFileNotFound, Message: "No such route: " + r.URL.Path})
	}
}

func routeBatches(a *batches.Call, r *http.Request, id, action string) {
	m := r.Method
	switch {
	case id == "" && m == http.MethodPost:
		a.CreateBatch()
	case id == "" && m == http.MethodGet:
		a.ListBatches()
	case id == "":
		a.NotAllowed("GET, POST")
	case action == "" && m == http.MethodGet:
		a.GetBatch(id)
	case action == "":
		a.NotAllowed("GET")
	case action == "cancel" && m == http.MethodPost:
		a.CancelBatch(id)
	case action == "cancel":
		a.NotAllowed("POST")
	default:
		a.Error(apierr.Error{Code: apierr.CodeBatchNotFound, Message: "No such route: " + r.URL.Path})
	}
}

// batchOrigin is what a batch created by r takes from its block (docs/batches.md): the
// callback r names, the block's async settings, the server r came through.
func (h *Handler) batchOrigin(w http.ResponseWriter, r *http.Request) (batches.Origin, bool) {
	o := batches.Origin{Exec: h.conv.execution()}
	// Only an explicit Callback-Url: the site's default endpoint consumes operation events, and
	// a batch's are asked for by its creator (docs/batches.md, Webhooks).
	if r.Header.Get(headerCallback) != "" {
		cb, ok := h.conv.callbackFor(w, r, "")
		if !ok {
			return o, false
		}
		o.Callback = cb
	}
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		o.Server = serverID(srv)
	}
	return o, true
}

// param is an error's param, or nil for none.
func param(p string) *string {
	if p == "" {
		return nil
	}
	return &p
}

package batches

import (
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/store"
)

// The Files and Batches API's calls (docs/batches.md): module/ routes each to a method of Call;
// what a call decides (checks, quotas, expiry, who sees what) is here.

// Config is the API's settings, as the batches block sets them (docs/caddyfile.md).
type Config struct {
	// Prefix is where the API is served: {Prefix}/files and {Prefix}/batches.
	Prefix string
	// MaxFileSize is the largest file accepted, in bytes.
	MaxFileSize int64
	// MaxRequests is the most lines a batch's input file may have.
	MaxRequests int
	// MaxScopeBytes and MaxScopeFiles bound one scope's stored files together.
	MaxScopeBytes int64
	MaxScopeFiles int
}

// Covers reports whether path belongs to the Files or Batches API.
func (c *Config) Covers(path string) bool {
	for _, p := range []string{c.Prefix + "/files", c.Prefix + "/batches"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// ServesEndpoint reports whether ep may be a batch's endpoint (docs/batches.md): a path under
// the prefix, outside the API's own files and batches, written in its one canonical form (no
// dot segments, no doubled or trailing slash, no escapes, query, fragment or control
// characters), so the path stored, the one checked here and the one the site routes are the
// same string.
func (c *Config) ServesEndpoint(ep string) bool {
	if !strings.HasPrefix(ep, c.Prefix+"/") || path.Clean(ep) != ep || strings.HasPrefix(ep, "//") {
		return false
	}
	if strings.ContainsFunc(ep, func(r rune) bool { return r <= ' ' || r == 0x7f || strings.ContainsRune("?#%\\", r) }) {
		return false
	}
	return !c.Covers(ep)
}

// fileLimits bound one upload (docs/batches.md, Scope and retention).
func (c *Config) fileLimits() store.FileLimits {
	return store.FileLimits{MaxBytes: c.MaxFileSize, ScopeBytes: c.MaxScopeBytes, ScopeFiles: c.MaxScopeFiles}
}

// Store is what the API asks of a storage: its files and batches, and the line operations a
// batch's output and error files are assembled from.
type Store interface {
	store.Batches
	store.Operations
}

// Kicker wakes the batch worker (a *Worker): a batch was created or is cancelling.
type Kicker interface{ Kick() }

// Caller is who makes a call: the hash of its scope, and whether it sent no credentials. An
// anonymous caller lists nothing, as in the operations API, and reaches only the files and
// batches whose ids it was given.
type Caller struct {
	Scope     string
	Anonymous bool
}

// Origin is what a new batch takes from the gateway around the API: where its batch.* events
// go, how its lines run, and the server they are sent through.
type Origin struct {
	Callback *store.Callback
	Exec     *store.Execution
	Server   string
}

// API is the Files and Batches API on one storage.
type API struct {
	Store  Store
	Worker Kicker
	// Clock decides a file's expiry and a batch's deadline and stamps their ids.
	Clock  clockwork.Clock
	Config Config
	// Retention is how long a file, and a final batch, is kept.
	Retention time.Duration
	// Scope is the handler's scope template: a line carries the request headers it reads, so
	// it is scoped and authorized as its creator.
	Scope string
	// NewID returns a fresh id with prefix, sorting by now: the gateway's one id generator.
	NewID func(prefix string, now time.Time) string
	// Origin resolves a new batch's Origin from its create call, after the call's checks; false
	// when it has answered the call (a Callback-Url refused).
	Origin func(w http.ResponseWriter, r *http.Request) (Origin, bool)
	Log    *zap.Logger
}

// Call is one call of the API, matched to its caller, at one instant of the API's clock.
type Call struct {
	api *API
	w   http.ResponseWriter
	r   *http.Request
	Caller
	now time.Time
}

// Call begins the call r, answered on w.
func (api *API) Call(w http.ResponseWriter, r *http.Request, c Caller) *Call {
	return &Call{api: api, w: w, r: r, Caller: c, now: api.Clock.Now()}
}

// Error answers e in OpenAI's error shape (apierr.WriteOpenAI), so the official SDKs raise
// their own error classes (docs/batches.md).
func (a *Call) Error(e apierr.Error) { apierr.WriteOpenAI(a.w, e) }

// NotAllowed answers a method the path does not take.
func (a *Call) NotAllowed(allow string) {
	a.w.Header().Set("Allow", allow)
	a.Error(apierr.Error{Code: apierr.CodeMethodNotAllowed, Message: "Use " + allow + " here."})
}

func (a *Call) invalid(message, p string) {
	a.Error(apierr.Error{Code: apierr.CodeInvalidRequest, Message: message, Param: param(p)})
}

func (a *Call) fail(err error) {
	a.api.Log.Error("storage unavailable", zap.Error(err))
	a.Error(apierr.Error{Code: apierr.CodeStorage, Message: "The gateway's storage is unavailable; retry shortly.", RetryAfter: time.Second})
}

func param(p string) *string {
	if p == "" {
		return nil
	}
	return &p
}

// paging reads OpenAI's `after` and `limit` (1..max, default 20).
func (a *Call) paging(max int) (after string, limit int, ok bool) {
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

// answerList answers a page of the caller's items, newest first, from list (a store's
// ListFiles or ListBatches), each shown as view; none for an anonymous caller (docs/batches.md).
func answerList[T, V any](a *Call, max int, list func(scope, after string, limit int) ([]T, bool, error), view func(T) V, id func(V) string) {
	after, limit, ok := a.paging(max)
	if !ok {
		return
	}
	var items []T
	var more bool
	if !a.Anonymous {
		var err error
		if items, more, err = list(a.Scope, after, limit); err != nil {
			a.fail(err)
			return
		}
	}
	views := make([]V, 0, len(items))
	for _, it := range items {
		views = append(views, view(it))
	}
	apierr.WriteJSON(a.w, http.StatusOK, listOf(views, id, more))
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

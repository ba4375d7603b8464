package responses

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/store"
)

// Host is what the routes on a stored response ask of the gateway beside reading it (Store):
// cancelling through the operations API's own path, what a deletion must outlast and evict,
// and answering a failure of the storage or of the memory budget.
type Host interface {
	Store
	// Stop cancels op through the operations API's own path (docs/api.md): a queued one at
	// once, a running one by cutting its upstream call wherever it runs. It returns op as it
	// then is.
	Stop(op *store.Operation) (*store.Operation, error)
	// Timeout is how long an attempt of op may run.
	Timeout(op *store.Operation) time.Duration
	// CreateKey is the record key of op's create under its Idempotency-Key.
	CreateKey(op *store.Operation) []byte
	// Fail answers err, which kept a route from answering.
	Fail(err error)
}

// Logger is where the routes tell what they did.
type Logger interface {
	Info(msg string, fields ...zap.Field)
}

// Call is one call of the routes on a stored response, matched to the caller's scope:
//
//	GET    {prefix}/responses/{id}         the response (?stream=true&starting_after=N: its events)
//	POST   {prefix}/responses/{id}/cancel  cancel it
//	DELETE {prefix}/responses/{id}         delete it
type Call struct {
	W      http.ResponseWriter
	R      *http.Request
	St     store.Backend
	Scope  string // the caller's
	Now    time.Time
	Host   Host
	Reader *Reader // reads through Host
	Log    Logger
}

// Serve answers the call on rest, the path after {prefix}/responses/.
func (c *Call) Serve(rest string) {
	id, action, _ := strings.Cut(rest, "/")
	m := c.R.Method
	switch {
	case id == "":
		c.NotFound(c.R.URL.Path)
	case action == "" && m == http.MethodGet:
		c.retrieve(id)
	case action == "" && m == http.MethodDelete:
		c.delete(id)
	case action == "":
		c.notAllowed("GET, DELETE")
	case action == "cancel" && m == http.MethodPost:
		c.cancel(id)
	case action == "cancel":
		c.notAllowed("POST")
	default:
		c.NotFound(c.R.URL.Path)
	}
}

// load returns the caller's response id, or answers 404: the same for another scope's, a
// deleted one, one past its retention, and an operation that is not a response.
func (c *Call) load(id string) *store.Operation {
	op, err := c.St.GetOperation(id)
	if err == nil && (op.Scope != c.Scope || op.Kind != Kind || op.As(c.Now).Status == store.StatusExpired) {
		err = store.ErrNotFound
	}
	if err == nil {
		var gone bool
		if gone, err = Deleted(c.St, op); err == nil && gone {
			err = store.ErrNotFound
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		c.Error(apierr.Error{Code: apierr.CodeResponseNotFound, Param: apierr.Param("response_id"), Message: "No response with id '" + id + "' found."})
		return nil
	case err != nil:
		c.Host.Fail(err)
		return nil
	}
	return op
}

// retrieve answers the response object, or with ?stream=true its events.
func (c *Call) retrieve(id string) {
	q := c.R.URL.Query()
	stream, err := ParseStream(q["stream"])
	if err != nil {
		c.Invalid(err.Error(), "stream")
		return
	}
	after, err := ParseStartingAfter(q["starting_after"])
	if err != nil {
		c.Invalid(err.Error(), "starting_after")
		return
	}
	op := c.load(id)
	if op == nil {
		return
	}
	if stream {
		c.Follow(op, after)
		return
	}
	c.writeObject(op)
}

// Follow answers op's events after sequence number after (-1: all of them), or the error that
// kept the stream from beginning.
func (c *Call) Follow(op *store.Operation, after int64) {
	err := c.Reader.Follow(c.W, op, after)
	var fe *FieldError
	switch {
	case errors.As(err, &fe):
		c.Invalid(fe.Message, fe.Param)
	case err != nil:
		c.Host.Fail(err)
	}
}

// writeObject answers op's response object.
func (c *Call) writeObject(op *store.Operation) {
	o, err := c.Reader.Object(op)
	if err != nil {
		c.Host.Fail(err)
		return
	}
	apierr.WriteJSON(c.W, http.StatusOK, o)
}

// cancel stops a queued or running response; cancelling a cancelled one answers it again,
// cancelling one that finished otherwise is 409 RESPONSE_ALREADY_FINAL. A response running on
// another replica stops at its next lease renewal; the answer waits for it a little while.
func (c *Call) cancel(id string) {
	op := c.load(id)
	if op == nil {
		return
	}
	op, err := c.Host.Stop(op)
	if err != nil {
		c.Host.Fail(err)
		return
	}
	if op.Status.Final() && op.Status != store.StatusCanceled {
		o, err := c.Reader.Object(op)
		if err != nil {
			c.Host.Fail(err)
			return
		}
		c.Error(apierr.Error{Code: apierr.CodeResponseAlreadyFinal, Param: apierr.Param("response_id"), Details: map[string]any{"status": o.Status()},
			Message: "Cannot cancel a response with status " + o.Status() + "."})
		return
	}
	c.writeObject(op)
}

// delete removes the response: it answers 404 from then on, on every replica and through the
// operations API too, and its create's key no longer replays it. A response still queued or
// running is cancelled first. Its stored request and answer, unreachable from then on, are
// dropped when its retention ends, as every operation's are (docs/responses.md).
func (c *Call) delete(id string) {
	op := c.load(id)
	if op == nil {
		return
	}
	if !op.Status.Final() {
		var err error
		if op, err = c.Host.Stop(op); err != nil {
			c.Host.Fail(err)
			return
		}
	}
	key := DeletedKey(op)
	claim, err := c.St.ClaimKey(key, []byte("deleted"), time.Minute)
	if err == nil && claim.Outcome == store.Claimed {
		expires := c.Now.Add(op.Retention + c.Host.Timeout(op) + time.Hour)
		err = c.St.CompleteKey(key, claim.Token, store.Response{Status: http.StatusOK, Header: http.Header{}}, expires)
	}
	if err == nil && op.IdempotencyKey != "" {
		// The create's key no longer replays the deleted response (its object repeats the
		// request's fields): a retry with it creates a new one.
		_, err = c.St.EvictKey(c.Host.CreateKey(op))
	}
	if err != nil {
		c.Host.Fail(err)
		return
	}
	c.Log.Info("background response deleted", zap.String("response_id", id))
	apierr.WriteJSON(c.W, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}

// Error answers e in the error schema with OpenAI's type, as the Batches API does.
func (c *Call) Error(e apierr.Error) { apierr.WriteOpenAI(c.W, e) }

// Invalid answers 400 invalid_request_error about parameter p ("" for none).
func (c *Call) Invalid(message, p string) {
	c.Error(apierr.Error{Code: apierr.CodeInvalidRequest, Message: message, Param: apierr.Param(p)})
}

// NotFound answers 404 for a route that does not exist.
func (c *Call) NotFound(path string) {
	c.Error(apierr.Error{Code: apierr.CodeResponseNotFound, Message: "No such route: " + path})
}

func (c *Call) notAllowed(allow string) {
	c.W.Header().Set("Allow", allow)
	c.Error(apierr.Error{Code: apierr.CodeMethodNotAllowed, Message: "Use " + allow + " here."})
}

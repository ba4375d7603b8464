package responses

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// routeHost is the gateway's side of the routes over a real Badger store: the operation as
// stored, no live attempt, the recorded answer, cancel as a transition of an operation not
// final yet, failures as 503.
type routeHost struct {
	st      *badger.Store
	w       http.ResponseWriter
	stopped []string
}

func (h *routeHost) GetOperation(id string) (*store.Operation, error) { return h.st.GetOperation(id) }
func (h *routeHost) Live(*store.Operation) streams.Source             { return nil }
func (h *routeHost) AwaitAnswer(op *store.Operation) *store.Operation { return op }
func (h *routeHost) Timeout(*store.Operation) time.Duration           { return time.Minute }
func (h *routeHost) CreateKey(*store.Operation) []byte                { return []byte("create-key") }

func (h *routeHost) LoadResult(op *store.Operation, _ int64) (*store.Response, func(), error) {
	res, err := h.st.LoadResult(op.ID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, func() {}, nil
	}
	return res, func() {}, err
}

func (h *routeHost) Stop(op *store.Operation) (*store.Operation, error) {
	if op.Status.Final() {
		return op, nil
	}
	h.stopped = append(h.stopped, op.ID)
	return h.st.Transition(op.ID, store.Change{To: store.StatusCanceled})
}

func (h *routeHost) Fail(err error) {
	apierr.WriteOpenAI(h.w, apierr.Error{Code: apierr.CodeStorage, Message: err.Error()})
}

// storedResponse accepts a background response of scope in st, queued, with a create key.
func storedResponse(t *testing.T, st *badger.Store, id, scope string) *store.Operation {
	t.Helper()
	op := &store.Operation{ID: id, Scope: scope, Status: store.StatusQueued, Version: 1, Method: "POST", Path: "/v1/responses",
		SubmittedAt: time.Now(), Retention: time.Hour, Kind: Kind, Urgency: store.DefaultUrgency, IdempotencyKey: "k"}
	if _, err := st.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/responses", Header: http.Header{}}, nil); err != nil {
		t.Fatal(err)
	}
	return op
}

// serveRoute answers method target for the caller of scope.
func serveRoute(h *routeHost, method, target, scope string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	r := httptest.NewRequest(method, target, nil)
	h.w = w
	c := &Call{W: w, R: r, St: h.st, Scope: scope, Now: time.Now(), Host: h, Log: zap.NewNop(),
		Reader: &Reader{Store: h, Clock: clockwork.NewRealClock(), Context: r.Context(), Objects: NewObjects()}}
	c.Serve(strings.TrimPrefix(r.URL.Path, "/v1/responses/"))
	return w
}

// openAIError is the error object of an answer in OpenAI's shape.
func openAIError(t *testing.T, w *httptest.ResponseRecorder) (code, param string) {
	t.Helper()
	var body struct {
		Error struct {
			Code  string  `json:"code"`
			Param *string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("%d %s: not an error object: %v", w.Code, w.Body, err)
	}
	if body.Error.Param != nil {
		param = *body.Error.Param
	}
	return body.Error.Code, param
}

// The routes on a stored response: another scope's is not found, as an unknown one is; a wrong
// method names the allowed ones; a bad stream parameter is refused before anything is read.
func TestRoutesRefuseWhatIsNotTheCallers(t *testing.T) {
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	storedResponse(t, st, "resp_1", "alice")
	h := &routeHost{st: st}
	for _, c := range []struct {
		method, target, scope string
		status                int
		code, param, allow    string
	}{
		{"GET", "/v1/responses/resp_1", "bob", 404, "response_not_found", "response_id", ""},
		{"GET", "/v1/responses/resp_nope", "alice", 404, "response_not_found", "response_id", ""},
		{"POST", "/v1/responses/resp_1/cancel", "bob", 404, "response_not_found", "response_id", ""},
		{"GET", "/v1/responses/resp_1/other", "alice", 404, "response_not_found", "", ""},
		{"PUT", "/v1/responses/resp_1", "alice", 405, "method_not_allowed", "", "GET, DELETE"},
		{"GET", "/v1/responses/resp_1/cancel", "alice", 405, "method_not_allowed", "", "POST"},
		{"GET", "/v1/responses/resp_1?stream=maybe", "alice", 400, "invalid_request", "stream", ""},
		{"GET", "/v1/responses/resp_1?stream=true&starting_after=x", "alice", 400, "invalid_request", "starting_after", ""},
	} {
		w := serveRoute(h, c.method, c.target, c.scope)
		code, param := openAIError(t, w)
		if w.Code != c.status || !strings.EqualFold(code, c.code) || param != c.param || w.Header().Get("Allow") != c.allow {
			t.Errorf("%s %s as %s: %d %s param %q Allow %q; want %d %s param %q Allow %q",
				c.method, c.target, c.scope, w.Code, code, param, w.Header().Get("Allow"), c.status, c.code, c.param, c.allow)
		}
	}
	if len(h.stopped) != 0 {
		t.Fatalf("refused calls stopped %v", h.stopped)
	}
}

// Cancelling a finished response is 409 with its status; deleting a queued one cancels it
// first, answers the deletion, and from then on the response is not found and its create's
// key no longer replays it.
func TestRoutesCancelAndDelete(t *testing.T) {
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h := &routeHost{st: st}

	storedResponse(t, st, "resp_done", "alice")
	if _, err := st.ClaimNext("w", time.Minute); err != nil {
		t.Fatal(err)
	}
	answer := "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"object\":\"response\",\"status\":\"completed\",\"output\":[]}}\n\n"
	if _, err := st.Transition("resp_done", store.Change{To: store.StatusSucceeded, Holder: "w",
		Result: &store.Response{Status: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: []byte(answer)}}); err != nil {
		t.Fatal(err)
	}
	w := serveRoute(h, "POST", "/v1/responses/resp_done/cancel", "alice")
	if code, _ := openAIError(t, w); w.Code != http.StatusConflict || !strings.EqualFold(code, string(apierr.CodeResponseAlreadyFinal)) || !strings.Contains(w.Body.String(), `"completed"`) {
		t.Fatalf("cancel of a completed response: %d %s", w.Code, w.Body)
	}
	if w := serveRoute(h, "GET", "/v1/responses/resp_done", "alice"); w.Code != 200 || !strings.Contains(w.Body.String(), `"status":"completed"`) {
		t.Fatalf("retrieve: %d %s", w.Code, w.Body)
	}

	storedResponse(t, st, "resp_q", "alice")
	if _, err := st.ClaimKey([]byte("create-key"), []byte("fp"), time.Minute); err != nil {
		t.Fatal(err)
	}
	w = serveRoute(h, "DELETE", "/v1/responses/resp_q", "alice")
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"deleted":true`) || len(h.stopped) != 1 || h.stopped[0] != "resp_q" {
		t.Fatalf("delete of a queued response: %d %s, stopped %v", w.Code, w.Body, h.stopped)
	}
	if w := serveRoute(h, "GET", "/v1/responses/resp_q", "alice"); w.Code != http.StatusNotFound {
		t.Fatalf("a deleted response: %d %s", w.Code, w.Body)
	}
	if c, err := st.ClaimKey([]byte("create-key"), []byte("fp"), time.Minute); err != nil || c.Outcome != store.Claimed {
		t.Fatalf("the create's key after the deletion: %+v %v, want it free", c, err)
	}
}

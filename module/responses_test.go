package module

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

const responsesBlock = "responses /v1\n"

// respUpstream wraps the model server and keeps the bodies of the Responses calls it got; an
// input "answer json" is answered whole, as JSON, though the call asks for a stream.
type respUpstream struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (u *respUpstream) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/responses" {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var m map[string]any
			_ = json.Unmarshal(body, &m)
			u.mu.Lock()
			u.bodies = append(u.bodies, m)
			u.mu.Unlock()
			if m["input"] == "answer json" {
				body = bytes.Replace(body, []byte(`"stream":true`), []byte(`"stream":false`), 1)
				r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (u *respUpstream) calls() []map[string]any {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]map[string]any(nil), u.bodies...)
}

// respObject is the part of OpenAI's response object the tests read.
type respObject struct {
	ID         string `json:"id"`
	Object     string `json:"object"`
	Status     string `json:"status"`
	Background bool   `json:"background"`
	Model      string `json:"model"`
	CreatedAt  int64  `json:"created_at"`
	Metadata   map[string]string
	Error      *struct{ Code, Message string } `json:"error"`
	Output     []struct {
		Type    string                        `json:"type"`
		Content []struct{ Type, Text string } `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func (o respObject) text() string {
	var b strings.Builder
	for _, it := range o.Output {
		for _, c := range it.Content {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

func decodeResponse(t *testing.T, r result) respObject {
	t.Helper()
	var o respObject
	if r.err != nil || r.StatusCode != 200 || json.Unmarshal(r.body, &o) != nil || o.Object != "response" {
		t.Fatalf("not a response object: %v %v %s", r.err, r.Response, r.body)
	}
	return o
}

// createResponse posts a background response and returns the object answered.
func (g *gateway) createResponse(t *testing.T, body string, headers ...string) respObject {
	t.Helper()
	return decodeResponse(t, g.post("/v1/responses", "", body, headers...))
}

// awaitResponse polls response id until it is final.
func (g *gateway) awaitResponse(t *testing.T, id string, headers ...string) respObject {
	t.Helper()
	var o respObject
	testkit.WaitFor(t, 60*time.Second, "response "+id+" ended", func() bool {
		o = decodeResponse(t, g.get("/v1/responses/"+id, headers...))
		return o.Status != "queued" && o.Status != "in_progress"
	})
	return o
}

func (g *gateway) responseCall(method, path string, headers ...string) result {
	req, _ := http.NewRequest(method, g.base+path, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return g.do(req)
}

var alice = []string{"Authorization", "Bearer alice"}

func TestResponsesBackgroundIsStoredThenCompletesWithTheGatewaysID(t *testing.T) {
	up := &respUpstream{}
	g := startGatewayWith(t, gatewaySetup{wrap: up.wrap, mulligan: responsesBlock})
	o := g.createResponse(t, `{"model":"m1","input":"hello there","background":true,"metadata":{"k":"v"}}`, alice...)
	if !strings.HasPrefix(o.ID, "resp_") || strings.HasPrefix(o.ID, "resp_ms") || o.Status != "queued" || !o.Background ||
		o.Model != "m1" || o.Metadata["k"] != "v" || o.CreatedAt == 0 {
		t.Fatalf("created: %+v", o)
	}
	done := g.awaitResponse(t, o.ID, alice...)
	if done.Status != "completed" || done.ID != o.ID || !done.Background || done.text() != "You said: hello there" ||
		done.Usage == nil || done.Usage.OutputTokens != 4 || done.CreatedAt != o.CreatedAt {
		t.Fatalf("completed: %+v", done)
	}
	calls := up.calls()
	if len(calls) != 1 {
		t.Fatalf("the model server got %d calls, want 1", len(calls))
	}
	if _, has := calls[0]["background"]; has || calls[0]["stream"] != true || calls[0]["model"] != "m1" {
		t.Fatalf("the upstream got %v: want the request without background, streamed", calls[0])
	}
	// The result is kept: a later retrieval answers the same, without another upstream call.
	if again := decodeResponse(t, g.get("/v1/responses/"+o.ID, alice...)); again.text() != done.text() || len(up.calls()) != 1 {
		t.Fatalf("retrieved again: %+v after %d calls", again, len(up.calls()))
	}
}

func TestResponsesWithoutBackgroundPassThrough(t *testing.T) {
	up := &respUpstream{}
	g := startGatewayWith(t, gatewaySetup{wrap: up.wrap, mulligan: responsesBlock})
	o := decodeResponse(t, g.post("/v1/responses", "", `{"input":"plain","background":false}`, alice...))
	if !strings.HasPrefix(o.ID, "resp_ms") || o.Status != "completed" || o.text() != "You said: plain" {
		t.Fatalf("passed through: %+v", o)
	}
	if calls := up.calls(); len(calls) != 1 || calls[0]["background"] != false {
		t.Fatalf("the upstream got %v, want the body untouched", calls)
	}
}

func TestResponsesBelongToTheirScope(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	o := g.createResponse(t, `{"input":"mine","background":true}`, alice...)
	g.awaitResponse(t, o.ID, alice...)
	for _, who := range [][]string{{"Authorization", "Bearer bob"}, nil} {
		for _, r := range []result{
			g.get("/v1/responses/"+o.ID, who...),
			g.get("/v1/responses/"+o.ID+"?stream=true", who...),
			g.responseCall("POST", "/v1/responses/"+o.ID+"/cancel", who...),
			g.responseCall("DELETE", "/v1/responses/"+o.ID, who...),
		} {
			expectOpenAIError(t, r, http.StatusNotFound, apierr.CodeResponseNotFound, o.ID)
		}
	}
	expectOpenAIError(t, g.get("/v1/responses/resp_nonesuch", alice...), http.StatusNotFound, apierr.CodeResponseNotFound, "resp_nonesuch")
	// An operation id is not a response id.
	_, op := g.submit(t, "k1", "Authorization", "Bearer alice")
	expectOpenAIError(t, g.get("/v1/responses/"+op.OperationID, alice...), http.StatusNotFound, apierr.CodeResponseNotFound, op.OperationID)
	if got := decodeResponse(t, g.get("/v1/responses/"+o.ID, alice...)); got.Status != "completed" {
		t.Fatalf("the owner reads %+v", got)
	}
}

func TestResponsesCancelCutsTheUpstreamAndIsIdempotent(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	hdr := append([]string{"X-Mock-Latency", "30s"}, alice...)
	o := g.createResponse(t, `{"input":"long work","background":true}`, hdr...)
	testkit.WaitFor(t, 10*time.Second, "the upstream call began", func() bool { return g.model.Stats().InFlight == 1 })
	first := decodeResponse(t, g.responseCall("POST", "/v1/responses/"+o.ID+"/cancel", alice...))
	second := decodeResponse(t, g.responseCall("POST", "/v1/responses/"+o.ID+"/cancel", alice...))
	if first.Status != "cancelled" || second.Status != "cancelled" || first.ID != o.ID || second.ID != o.ID {
		t.Fatalf("cancelled %+v, then %+v", first, second)
	}
	testkit.WaitFor(t, 10*time.Second, "the upstream call was cut", func() bool {
		st := g.model.Stats()
		return st.InFlight == 0 && st.Abandoned == 1
	})
	if got := decodeResponse(t, g.get("/v1/responses/"+o.ID, alice...)); got.Status != "cancelled" {
		t.Fatalf("retrieved after cancel: %+v", got)
	}
	// A completed response cannot be cancelled.
	done := g.createResponse(t, `{"input":"quick","background":true}`, alice...)
	g.awaitResponse(t, done.ID, alice...)
	expectOpenAIError(t, g.responseCall("POST", "/v1/responses/"+done.ID+"/cancel", alice...), http.StatusConflict, apierr.CodeResponseAlreadyFinal, "completed")
}

func TestResponsesCancelOfAQueuedOne(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "async {\n concurrency 1\n}\n"+responsesBlock)
	hdr := append([]string{"X-Mock-Latency", "30s"}, alice...)
	busy := g.createResponse(t, `{"input":"holds the only worker","background":true}`, hdr...)
	testkit.WaitFor(t, 10*time.Second, "the first response runs", func() bool { return g.model.Stats().InFlight == 1 })
	waiting := g.createResponse(t, `{"input":"waits","background":true}`, alice...)
	if got := decodeResponse(t, g.responseCall("POST", "/v1/responses/"+waiting.ID+"/cancel", alice...)); got.Status != "cancelled" {
		t.Fatalf("cancelled while queued: %+v", got)
	}
	decodeResponse(t, g.responseCall("POST", "/v1/responses/"+busy.ID+"/cancel", alice...))
	if st := g.model.Stats(); st.Received != 1 {
		t.Fatalf("the model server got %d calls, want 1: the queued one never reached it", st.Received)
	}
}

func TestResponsesDelete(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	o := g.createResponse(t, `{"input":"to delete","background":true}`, alice...)
	g.awaitResponse(t, o.ID, alice...)
	r := g.responseCall("DELETE", "/v1/responses/"+o.ID, alice...)
	var d struct {
		ID      string `json:"id"`
		Deleted bool   `json:"deleted"`
	}
	if r.StatusCode != 200 || json.Unmarshal(r.body, &d) != nil || d.ID != o.ID || !d.Deleted {
		t.Fatalf("delete: %v %s", r.Response, r.body)
	}
	expectOpenAIError(t, g.get("/v1/responses/"+o.ID, alice...), http.StatusNotFound, apierr.CodeResponseNotFound, o.ID)
	expectOpenAIError(t, g.responseCall("DELETE", "/v1/responses/"+o.ID, alice...), http.StatusNotFound, apierr.CodeResponseNotFound, o.ID)
}

// A deleted response is gone for every API: the operations API's get, result and list too, and
// its create's key no longer replays it.
func TestResponsesDeleteHidesItFromTheOperationsAPI(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	body := `{"input":"secret text","background":true}`
	o := decodeResponse(t, g.post("/v1/responses", "del-1", body, alice...))
	kept := g.createResponse(t, `{"input":"kept","background":true}`, alice...)
	g.awaitResponse(t, o.ID, alice...)
	g.awaitResponse(t, kept.ID, alice...)
	if r := g.responseCall("DELETE", "/v1/responses/"+o.ID, alice...); r.StatusCode != 200 {
		t.Fatalf("delete: %v %s", r.Response, r.body)
	}
	expectError(t, g.get("/v1/operations/"+o.ID, alice...), http.StatusNotFound, apierr.CodeOperationNotFound, false)
	expectError(t, g.get("/v1/operations/"+o.ID+"/result", alice...), http.StatusNotFound, apierr.CodeOperationNotFound, false)
	l := g.get("/v1/operations", alice...)
	if l.StatusCode != 200 || strings.Contains(string(l.body), o.ID) || !strings.Contains(string(l.body), kept.ID) {
		t.Fatalf("the list after the delete: %v %s", l.Response, l.body)
	}
	if again := decodeResponse(t, g.post("/v1/responses", "del-1", body, alice...)); again.ID == o.ID {
		t.Fatalf("a retry with the create's key replayed the deleted %s", o.ID)
	}
}

func TestResponsesUpstreamFailureIsAFailedResponse(t *testing.T) {
	up := &respUpstream{}
	g := startGatewayWith(t, gatewaySetup{wrap: up.wrap, mulligan: "async {\n retries 0\n}\n" + responsesBlock})
	o := g.createResponse(t, `{"input":"x","background":true}`, append([]string{"X-Mock-Status", "500"}, alice...)...)
	done := g.awaitResponse(t, o.ID, alice...)
	if done.Status != "failed" || done.Error == nil || done.Error.Code != "mock_injected_failure" || done.Error.Message == "" {
		t.Fatalf("failed: %+v %+v", done, done.Error)
	}
	// An upstream that answers JSON to the streamed call: its object is the final one.
	j := g.createResponse(t, `{"input":"answer json","background":true}`, alice...)
	if done := g.awaitResponse(t, j.ID, alice...); done.Status != "completed" || done.ID != j.ID || done.text() != "You said: answer json" {
		t.Fatalf("answered as JSON: %+v", done)
	}
	evs := readRespEvents(t, g.followResponse(t, j.ID, "", alice...), 0)
	if len(evs) != 2 || evs[0].Type != "response.queued" || evs[1].Type != "response.completed" || evs[1].Response.ID != j.ID || evs[1].Seq != 1 {
		t.Fatalf("the stream of a response answered as JSON: %+v", evs)
	}
	// A failed one's stream ends with its failure.
	evs = readRespEvents(t, g.followResponse(t, o.ID, "", alice...), 0)
	if len(evs) != 2 || evs[1].Type != "response.failed" || evs[1].Response.Status != "failed" {
		t.Fatalf("the stream of a failed response: %+v", evs)
	}
}

func TestResponsesRefusesMalformedCreates(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	expectOpenAIError(t, g.post("/v1/responses", "", `{"background":true,`, alice...), http.StatusBadRequest, apierr.CodeInvalidRequest, "JSON")
	expectOpenAIError(t, g.post("/v1/responses", "", `[1,2]`, alice...), http.StatusBadRequest, apierr.CodeInvalidRequest, "JSON object")
	expectOpenAIError(t, g.post("/v1/responses", "", `{"background":"yes"}`, alice...), http.StatusBadRequest, apierr.CodeInvalidRequest, "background must be a boolean")
	expectOpenAIError(t, g.post("/v1/responses", "", `{"background":true,"stream":1}`, alice...), http.StatusBadRequest, apierr.CodeInvalidRequest, "stream must be a boolean")
	if st := g.model.Stats(); st.Received != 0 {
		t.Fatalf("the model server got %d calls", st.Received)
	}
}

// The request fields a response repeats are bounded: metadata as OpenAI bounds it, all of
// them together by responses.MaxEcho; beyond, 400 naming the field, before the upstream.
func TestResponsesBoundTheEchoedFields(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	pairs := make([]string, 17)
	for i := range pairs {
		pairs[i] = fmt.Sprintf(`"k%d":"v"`, i)
	}
	for body, want := range map[string]string{
		`{"input":"x","background":true,"metadata":{"k":"` + strings.Repeat("v", 513) + `"}}`:                                              "metadata.k is over 512",
		`{"input":"x","background":true,"metadata":{"` + strings.Repeat("k", 65) + `":"v"}}`:                                               "over 64 characters",
		`{"input":"x","background":true,"metadata":{` + strings.Join(pairs, ",") + `}}`:                                                    "at most 16",
		`{"input":"x","background":true,"metadata":{"k":1}}`:                                                                               "must be a string",
		`{"input":"x","background":true,"instructions":"` + strings.Repeat("i", 200<<10) + `"}`:                                            "instructions the largest",
		`{"input":"x","background":true,"metadata":{"k":"v"},"tools":[` + strings.Repeat(`{"type":"function","name":"f"},`, 5000) + `{}]}`: "tools the largest",
	} {
		r := g.post("/v1/responses", "", body, alice...)
		expectOpenAIError(t, r, http.StatusBadRequest, apierr.CodeInvalidRequest, want)
	}
	if st := g.model.Stats(); st.Received != 0 {
		t.Fatalf("the model server got %d calls", st.Received)
	}
	o := g.createResponse(t, `{"input":"x","background":true,"instructions":"`+strings.Repeat("i", 100<<10)+`"}`, alice...)
	g.awaitResponse(t, o.ID, alice...)
}

func TestCaddyfileParsesResponses(t *testing.T) {
	d := caddyfile.NewTestDispenser("mulligan {\n responses /v1 {\n retention 1h\n urgency 6\n timeout 5m\n max_result 1MiB\n }\n}")
	var h Handler
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	r := h.Responses
	if r == nil || r.Prefix != "/v1" || time.Duration(r.Retention) != time.Hour || r.Urgency == nil || *r.Urgency != 6 ||
		time.Duration(r.Timeout) != 5*time.Minute || r.MaxResult != 1<<20 {
		t.Fatalf("parsed %+v", r)
	}
	for _, bad := range []string{"responses", "responses /v1 /v2", "responses /v1 {\n urgency 8\n}", "responses /v1 {\n colour blue\n}"} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("mulligan {\n " + bad + "\n}")); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	for _, bad := range []*ResponsesConfig{{Prefix: "v1"}, {Prefix: "/v1/*"}, {Prefix: "/v1", Urgency: new(9)}} {
		if err := bad.validate(); err == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}

func TestResponsesWebhooksAreOpenAIsSignedPerStandardWebhooks(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, secretA, nil)
	g := startHandler(t, modelserver.Config{}, webhooksBlock(rc.srv.URL, "", secretA)+"\n"+responsesBlock)
	done := g.createResponse(t, `{"input":"hook me","background":true}`, alice...)
	g.awaitResponse(t, done.ID, alice...)
	hdr := append([]string{"X-Mock-Latency", "30s"}, alice...)
	cut := g.createResponse(t, `{"input":"cut me","background":true}`, hdr...)
	decodeResponse(t, g.responseCall("POST", "/v1/responses/"+cut.ID+"/cancel", alice...))
	failed := g.createResponse(t, `{"input":"fail me","background":true}`, append([]string{"X-Mock-Status", "400"}, alice...)...)
	g.awaitResponse(t, failed.ID, alice...)
	testkit.WaitFor(t, 10*time.Second, "three deliveries", func() bool { return rc.delivered() == 3 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	want := map[string]string{done.ID: "response.completed", cut.ID: "response.cancelled", failed.ID: "response.failed"}
	for _, ev := range rc.events {
		data, _ := ev["data"].(map[string]any)
		id, _ := data["id"].(string)
		evID, _ := ev["id"].(string)
		if ev["object"] != "event" || ev["type"] != want[id] || !strings.HasPrefix(evID, "evt_") || ev["created_at"] == nil || len(data) != 1 {
			t.Errorf("event %v, want type %s", ev, want[id])
		}
		delete(want, id)
	}
	if len(want) != 0 || rc.badSigs != 0 {
		t.Fatalf("not delivered: %v; bad signatures: %d", want, rc.badSigs)
	}
}

func TestResponsesCreateWithAKeyReplaysTheSameResponse(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	body := `{"input":"once","background":true}`
	first := decodeResponse(t, g.post("/v1/responses", "create-1", body, alice...))
	again := decodeResponse(t, g.post("/v1/responses", "create-1", body, alice...))
	if again.ID != first.ID {
		t.Fatalf("a retry with the key created %s, want %s", again.ID, first.ID)
	}
	g.awaitResponse(t, first.ID, alice...)
	expectError(t, g.post("/v1/responses", "create-1", `{"input":"other","background":true}`, alice...), http.StatusConflict, apierr.CodeKeyReused, false)
	if st := g.model.Stats(); st.Received != 1 {
		t.Fatalf("the model server ran %d times, want once", st.Received)
	}
}

func TestResponsesWebhookGoesToTheCallbackUrl(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, secretA, nil)
	g := startHandler(t, modelserver.Config{}, "webhooks {\n endpoint hooks "+rc.srv.URL+"/hooks/* {\n secret "+secretA+"\n }\n allow_private\n}\n"+responsesBlock)
	expectError(t, g.post("/v1/responses", "", `{"input":"x","background":true}`, append([]string{"Callback-Url", "https://evil.example.com/hooks/x"}, alice...)...),
		http.StatusUnprocessableEntity, apierr.CodeCallbackNotAllow, false)
	quiet := g.createResponse(t, `{"input":"no hook","background":true}`, alice...)
	hooked := g.createResponse(t, `{"input":"hook","background":true}`, append([]string{"Callback-Url", rc.srv.URL + "/hooks/agent-7"}, alice...)...)
	g.awaitResponse(t, quiet.ID, alice...)
	g.awaitResponse(t, hooked.ID, alice...)
	testkit.WaitFor(t, 10*time.Second, "the delivery", func() bool { return rc.delivered() == 1 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if data, _ := rc.events[0]["data"].(map[string]any); data["id"] != hooked.ID || rc.events[0]["type"] != "response.completed" {
		t.Fatalf("delivered %v, want %s's response.completed alone", rc.events, hooked.ID)
	}
}

// A body over max_body is not the gateway's to store: it goes on as without the block.
func TestResponsesOverMaxBodyPassThrough(t *testing.T) {
	up := &respUpstream{}
	g := startGatewayWith(t, gatewaySetup{wrap: up.wrap, mulligan: "idempotency {\n max_body 1KiB\n}\n" + responsesBlock})
	big := `{"input":"` + strings.Repeat("x ", 1000) + `"}`
	o := decodeResponse(t, g.post("/v1/responses", "", big, alice...))
	if !strings.HasPrefix(o.ID, "resp_ms") || o.Status != "completed" || len(up.calls()) != 1 {
		t.Fatalf("a large request without background: %+v, %d upstream calls", o, len(up.calls()))
	}
	r := g.post("/v1/responses", "", `{"background":true,"input":"`+strings.Repeat("x ", 1000)+`"}`, alice...)
	if r.StatusCode != http.StatusBadRequest || !strings.Contains(string(r.body), "background_unsupported") {
		t.Fatalf("a large background request: %v %s, want the upstream's refusal", r.Response, r.body)
	}
}

// A poll of a running response shows the output streamed so far.
func TestResponsesInProgressShowsTheOutputSoFar(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	s := g.createStream(t, `{"input":"a b c d e f g h","background":true,"stream":true}`, append([]string{"X-Mock-Chunk-Delay", "300ms"}, alice...)...)
	evs := readRespEvents(t, s, 7) // queued, created, in_progress, item, part, two deltas
	id := evs[0].Response.ID
	o := decodeResponse(t, g.get("/v1/responses/"+id, alice...))
	if o.Status != "in_progress" || !strings.HasPrefix("You said: a b c d e f g h", o.text()) || len(o.text()) < len("You said:") {
		t.Fatalf("polled while running: %s %q", o.Status, o.text())
	}
	readRespEvents(t, s, 0)
	if done := g.awaitResponse(t, id, alice...); done.text() != "You said: a b c d e f g h" {
		t.Fatalf("completed: %q", done.text())
	}
}

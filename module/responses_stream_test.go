package module

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// respEvent is one event of a response's stream as a client reads it.
type respEvent struct {
	Type     string     `json:"type"`
	Seq      int64      `json:"sequence_number"`
	Delta    string     `json:"delta"`
	Code     string     `json:"code"`
	Response respObject `json:"response"`
}

func readRespEvent(t *testing.T, s *sseStream) (respEvent, bool) {
	t.Helper()
	e, err := s.read()
	for err == nil && strings.HasPrefix(e.raw, ":") { // a comment (keep-alive), as clients skip it
		e, err = s.read()
	}
	if err == io.EOF {
		return respEvent{}, false
	}
	if err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	var ev respEvent
	if err := json.Unmarshal([]byte(e.data), &ev); err != nil {
		t.Fatalf("event %q: %v", e.raw, err)
	}
	if !strings.HasPrefix(e.raw, "event: "+ev.Type+"\n") {
		t.Fatalf("event %q: its name is not its type", e.raw)
	}
	return ev, true
}

// readRespEvents reads events until the end of the stream, or n of them when n > 0.
func readRespEvents(t *testing.T, s *sseStream, n int) []respEvent {
	t.Helper()
	var out []respEvent
	for n <= 0 || len(out) < n {
		ev, ok := readRespEvent(t, s)
		if !ok {
			break
		}
		out = append(out, ev)
	}
	return out
}

// checkRespEvents checks that evs are numbered on from first without a gap and carry id.
func checkRespEvents(t *testing.T, evs []respEvent, first int64, id string) string {
	t.Helper()
	var text strings.Builder
	for i, ev := range evs {
		if ev.Seq != first+int64(i) {
			t.Fatalf("event %d has sequence_number %d, want %d: %+v", i, ev.Seq, first+int64(i), evs)
		}
		if ev.Response.ID != "" && ev.Response.ID != id {
			t.Fatalf("event %d carries response id %s, want %s", i, ev.Response.ID, id)
		}
		if ev.Type == "response.output_text.delta" {
			text.WriteString(ev.Delta)
		}
	}
	return text.String()
}

func (g *gateway) createStream(t *testing.T, body string, headers ...string) *sseStream {
	t.Helper()
	req, _ := http.NewRequest("POST", g.base+"/v1/responses", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return g.stream(req, headers...)
}

func (g *gateway) followResponse(t *testing.T, id, query string, headers ...string) *sseStream {
	t.Helper()
	req, _ := http.NewRequest("GET", g.base+"/v1/responses/"+id+"?stream=true"+query, nil)
	return g.stream(req, headers...)
}

func TestResponsesStreamLiveDropResumeAndReplay(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	hdr := append([]string{"X-Mock-Chunk-Delay", "20ms"}, alice...)
	s := g.createStream(t, `{"input":"one two three four five six","stream":true,"background":true}`, hdr...)
	head := readRespEvents(t, s, 6)
	if head[0].Type != "response.queued" || head[0].Response.Status != "queued" || !strings.HasPrefix(head[0].Response.ID, "resp_") {
		t.Fatalf("first event %+v", head[0])
	}
	id := head[0].Response.ID
	text := checkRespEvents(t, head, 0, id)
	s.resp.Body.Close() // the client drops

	rest := readRespEvents(t, g.followResponse(t, id, "&starting_after=5", alice...), 0)
	text += checkRespEvents(t, rest, 6, id)
	last := rest[len(rest)-1]
	if text != "You said: one two three four five six" || last.Type != "response.completed" || last.Response.Status != "completed" {
		t.Fatalf("text %q, last event %+v", text, last)
	}
	// Finished, the stream replays whole, numbered the same.
	whole := readRespEvents(t, g.followResponse(t, id, "", alice...), 0)
	if len(whole) != len(head)+len(rest) || checkRespEvents(t, whole, 0, id) != text {
		t.Fatalf("replay has %d events, want %d", len(whole), len(head)+len(rest))
	}
	tail := readRespEvents(t, g.followResponse(t, id, fmt.Sprintf("&starting_after=%d", len(whole)-2), alice...), 0)
	if len(tail) != 1 || tail[0].Type != "response.completed" {
		t.Fatalf("after the next to last event: %+v", tail)
	}
	if st := g.model.Stats(); st.Received != 1 {
		t.Fatalf("the model server ran %d times, want once", st.Received)
	}
	for _, bad := range []string{"-1", "abc", "1.5", "99999999999999999999", fmt.Sprint(len(whole)), "100000", "%2B5", "%205", "1&starting_after=99"} {
		expectOpenAIError(t, g.get("/v1/responses/"+id+"?stream=true&starting_after="+bad, alice...), http.StatusBadRequest, apierr.CodeInvalidRequest, "starting_after")
	}
	for _, bad := range []string{"1", "True", "yes", "true&stream=true"} {
		expectOpenAIError(t, g.get("/v1/responses/"+id+"?stream="+bad, alice...), http.StatusBadRequest, apierr.CodeInvalidRequest, "stream must be")
	}
}

// lossyUpstream streams a response whose first attempt breaks off after its third delta, once
// the test has seen it; later attempts finish.
type lossyUpstream struct {
	runs   atomic.Int32
	broken chan struct{} // closed by the test to let the first attempt break
}

func (u *lossyUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	run := u.runs.Add(1)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	send := func(typ string, data map[string]any) {
		data["type"] = typ
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
		_ = rc.Flush()
	}
	obj := func(status string) map[string]any {
		return map[string]any{"id": fmt.Sprintf("resp_up%d", run), "object": "response", "status": status}
	}
	send("response.created", map[string]any{"response": obj("in_progress")})
	for i := 1; i <= 5; i++ {
		send("response.output_text.delta", map[string]any{"delta": fmt.Sprintf("r%d.%d ", run, i)})
		if run == 1 && i == 3 {
			select {
			case <-u.broken:
			case <-r.Context().Done():
			}
			panic(http.ErrAbortHandler) // the connection drops mid-answer
		}
	}
	done := obj("completed")
	done["output"] = []any{map[string]any{"type": "message", "content": []any{map[string]any{"type": "output_text", "text": fmt.Sprintf("run %d", run)}}}}
	send("response.completed", map[string]any{"response": done})
}

// A follower of an attempt that is lost gets an error event and the end of the stream, never
// the next attempt's events after the lost one's; the response's stream, once it finished,
// reads whole from the one attempt that finished.
func TestResponsesStreamOfALostAttemptEndsWithAnError(t *testing.T) {
	up := &lossyUpstream{broken: make(chan struct{})}
	g := startGatewayBefore(t, up, quietGlobals, "async {\n retries 2\n}\n"+responsesBlock)
	s := g.createStream(t, `{"input":"x","stream":true,"background":true}`, alice...)
	head := readRespEvents(t, s, 5) // queued, created, three deltas
	id := head[0].Response.ID
	if got := checkRespEvents(t, head, 0, id); got != "r1.1 r1.2 r1.3 " {
		t.Fatalf("first attempt's text %q", got)
	}
	close(up.broken)
	rest := readRespEvents(t, s, 0)
	if len(rest) != 1 || rest[0].Type != "error" || rest[0].Code != "stream_attempt_lost" || rest[0].Seq != 5 {
		t.Fatalf("after the attempt was lost: %+v", rest)
	}
	done := g.awaitResponse(t, id, alice...)
	if done.Status != "completed" || done.ID != id || done.text() != "run 2" {
		t.Fatalf("completed: %+v", done)
	}
	whole := readRespEvents(t, g.followResponse(t, id, "", alice...), 0)
	if text := checkRespEvents(t, whole, 0, id); text != "r2.1 r2.2 r2.3 r2.4 r2.5 " {
		t.Fatalf("the finished stream reads %q, want the second attempt's alone", text)
	}
	testkit.WaitFor(t, 5*time.Second, "two attempts", func() bool { return up.runs.Load() == 2 })
}

// A streamed create that waits for the runner gets its first event, with the id, at once.
func TestResponsesStreamBeginsWhileQueued(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "async {\n concurrency 1\n}\n"+responsesBlock)
	busy := g.createResponse(t, `{"input":"holds the only worker","background":true}`, append([]string{"X-Mock-Latency", "30s"}, alice...)...)
	testkit.WaitFor(t, 10*time.Second, "the first response runs", func() bool { return g.model.Stats().InFlight == 1 })
	s := g.createStream(t, `{"input":"wait for me","stream":true,"background":true}`, alice...)
	first, ok := readRespEvent(t, s)
	if !ok || first.Type != "response.queued" || first.Response.Status != "queued" || first.Seq != 0 {
		t.Fatalf("first event while queued: %+v", first)
	}
	if st := g.model.Stats(); st.Received != 1 {
		t.Fatalf("the queued response reached the upstream before its first event: %d calls", st.Received)
	}
	decodeResponse(t, g.responseCall("POST", "/v1/responses/"+busy.ID+"/cancel", alice...))
	rest := readRespEvents(t, s, 0)
	if text := checkRespEvents(t, rest, 1, first.Response.ID); text != "You said: wait for me" || rest[len(rest)-1].Type != "response.completed" {
		t.Fatalf("then %q ending %+v", text, rest[len(rest)-1])
	}
}

// A follower of a response cancelled mid-stream gets its end: response.cancelled, numbered on.
func TestResponsesStreamOfACancelledResponseEndsCancelled(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	s := g.createStream(t, `{"input":"a b c d e f g h i j","stream":true,"background":true}`, append([]string{"X-Mock-Chunk-Delay", "1s"}, alice...)...)
	head := readRespEvents(t, s, 6)
	id := head[0].Response.ID
	decodeResponse(t, g.responseCall("POST", "/v1/responses/"+id+"/cancel", alice...))
	rest := readRespEvents(t, s, 0)
	if len(rest) == 0 {
		t.Fatal("the stream ended without an event")
	}
	last := rest[len(rest)-1]
	checkRespEvents(t, append(head, rest...), 0, id)
	if last.Type != "response.cancelled" || last.Response.Status != "cancelled" {
		t.Fatalf("after the cancel: %+v", rest)
	}
}

// A create with stream true retried with its Idempotency-Key answers the first create's
// response as a stream again, not its recorded JSON, and runs it once.
func TestResponsesKeyedStreamCreateRetriedAnswersTheStream(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, responsesBlock)
	body := `{"input":"once more","background":true,"stream":true}`
	create := func() []respEvent {
		req, _ := http.NewRequest("POST", g.base+"/v1/responses", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return readRespEvents(t, g.stream(req, append([]string{"Idempotency-Key", "stream-1"}, alice...)...), 0)
	}
	first := create()
	again := create()
	id := first[0].Response.ID
	if checkRespEvents(t, again, 0, id) != "You said: once more" || again[len(again)-1].Type != "response.completed" {
		t.Fatalf("the retry answered %+v", again)
	}
	if st := g.model.Stats(); st.Received != 1 {
		t.Fatalf("the model server ran %d times, want once", st.Received)
	}
}

// endlessUpstream answers a Responses call with a stream that has no terminal event
// ("noterminal"), or whose response.completed lacks its blank line ("unterminated").
func endlessUpstream(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m map[string]any
		_ = json.Unmarshal(body, &m)
		if r.URL.Path != "/v1/responses" || (m["input"] != "unterminated" && m["input"] != "noterminal") {
			r.Body = io.NopCloser(bytes.NewReader(body))
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_UPSTREAM\",\"object\":\"response\",\"status\":\"in_progress\"}}\n\n"+
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\",\"item_id\":\"msg_1\"}\n\n")
		if m["input"] == "unterminated" {
			_, _ = io.WriteString(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_UPSTREAM\",\"object\":\"response\",\"status\":\"completed\",\"output\":[]}}\n")
		}
	})
}

// A stream that ends without a terminal event, or whose last one is cut short (no blank line,
// so no event), ends with the response's final object, live and replayed, as a poll reads it.
func TestResponsesStreamWithoutATerminalEventEndsWithTheObject(t *testing.T) {
	g := startGatewayWith(t, gatewaySetup{wrap: endlessUpstream, mulligan: "async {\n retries 0\n}\n" + responsesBlock})
	for _, in := range []string{"noterminal", "unterminated"} {
		live := readRespEvents(t, g.createStream(t, `{"input":"`+in+`","background":true,"stream":true}`, alice...), 0)
		id := live[0].Response.ID
		checkRespEvents(t, live, 0, id)
		o := g.awaitResponse(t, id, alice...)
		replay := readRespEvents(t, g.followResponse(t, id, "", alice...), 0)
		checkRespEvents(t, replay, 0, id)
		for what, evs := range map[string][]respEvent{"live": live, "replayed": replay} {
			last := evs[len(evs)-1]
			if len(evs) != 4 || last.Type != "response."+o.Status || last.Response.Status != o.Status || o.Status != "failed" {
				t.Fatalf("%s: the %s stream %+v, the object %s", in, what, evs, o.Status)
			}
		}
		tail := readRespEvents(t, g.followResponse(t, id, "&starting_after=2", alice...), 0)
		if len(tail) != 1 || tail[0].Seq != 3 || tail[0].Type != "response.failed" {
			t.Fatalf("%s: resumed after 2: %+v", in, tail)
		}
	}
}

// A response cancelled mid-stream replays as its live follower saw it: the events relayed, then
// response.cancelled at the same number; a resume after the last one before it gets it.
func TestResponsesCancelledMidStreamResumesAndReplaysAsLive(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, responsesBlock)
	s := g.createStream(t, `{"input":"a b c d e f g h i j","stream":true,"background":true}`, append([]string{"X-Mock-Chunk-Delay", "300ms"}, alice...)...)
	live := readRespEvents(t, s, 6)
	id := live[0].Response.ID
	decodeResponse(t, g.responseCall("POST", "/v1/responses/"+id+"/cancel", alice...))
	live = append(live, readRespEvents(t, s, 0)...)
	checkRespEvents(t, live, 0, id)
	last := live[len(live)-1]
	if last.Type != "response.cancelled" {
		t.Fatalf("live: %+v", live)
	}
	checkReplayedAsLive(t, readRespEvents(t, g.followResponse(t, id, "", alice...), 0), live)
	tail := readRespEvents(t, g.followResponse(t, id, fmt.Sprintf("&starting_after=%d", last.Seq-1), alice...), 0)
	if len(tail) != 1 || tail[0].Seq != last.Seq || tail[0].Type != "response.cancelled" || tail[0].Response.Status != "cancelled" {
		t.Fatalf("resumed after %d: %+v", last.Seq-1, tail)
	}
	if o := decodeResponse(t, g.get("/v1/responses/"+id, alice...)); o.Status != "cancelled" {
		t.Fatalf("the object: %+v", o)
	}
}

// A stream that waits (here for the only worker) writes SSE comments meanwhile, so that a
// proxy's idle timeout does not cut it; clients ignore them.
func TestResponsesStreamKeepsAliveWhileItWaits(t *testing.T) {
	// Not parallel: it sets the process's keep-alive interval.
	was := responseKeepAlive
	responseKeepAlive = 50 * time.Millisecond
	t.Cleanup(func() { responseKeepAlive = was }) // after the gateway has stopped
	g := startHandler(t, modelserver.Config{}, "async {\n concurrency 1\n}\n"+responsesBlock)
	busy := g.createResponse(t, `{"input":"holds the only worker","background":true}`, append([]string{"X-Mock-Latency", "30s"}, alice...)...)
	testkit.WaitFor(t, 10*time.Second, "the first response runs", func() bool { return g.model.Stats().InFlight == 1 })
	s := g.createStream(t, `{"input":"wait for me","background":true,"stream":true}`, alice...)
	for comments := 0; comments < 2; {
		line, err := s.rd.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended: %v", err)
		}
		if line == ": keep-alive\n" {
			comments++
			if blank, _ := s.rd.ReadString('\n'); blank != "\n" {
				t.Fatalf("a comment followed by %q", blank)
			}
		}
	}
	decodeResponse(t, g.responseCall("POST", "/v1/responses/"+busy.ID+"/cancel", alice...))
	rest := readRespEvents(t, s, 0)
	if text := checkRespEvents(t, rest, 1, rest[0].Response.ID); text != "You said: wait for me" || rest[len(rest)-1].Type != "response.completed" {
		t.Fatalf("then %q: %+v", text, rest)
	}
}

// A response that fails RESULT_TOO_LARGE mid-stream replays as its live follower saw it: the
// events within max_result, then response.failed at the same number.
func TestResponsesTooLargeReplaysAsLive(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "responses /v1 {\n max_result 2000\n}\n")
	s := g.createStream(t, `{"input":"a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n o p","stream":true,"background":true}`,
		append([]string{"X-Mock-Chunk-Delay", "5ms"}, alice...)...)
	live := readRespEvents(t, s, 0)
	id := live[0].Response.ID
	checkRespEvents(t, live, 0, id)
	last := live[len(live)-1]
	if last.Type != "response.failed" || last.Response.Error == nil || last.Response.Error.Code != "RESULT_TOO_LARGE" || len(live) < 4 {
		t.Fatalf("live: %+v", live)
	}
	checkReplayedAsLive(t, readRespEvents(t, g.followResponse(t, id, "", alice...), 0), live)
	if o := g.awaitResponse(t, id, alice...); o.Status != "failed" || o.Error == nil || o.Error.Code != "RESULT_TOO_LARGE" {
		t.Fatalf("the object: %+v", o)
	}
}

// checkReplayedAsLive checks that a replay of a finished response's stream gave the events its
// live stream gave, in order, with the same sequence numbers.
func checkReplayedAsLive(t *testing.T, replay, live []respEvent) {
	t.Helper()
	if len(replay) != len(live) {
		t.Fatalf("replayed %d events, live %d: %+v", len(replay), len(live), replay)
	}
	for i := range live {
		if replay[i].Type != live[i].Type || replay[i].Seq != live[i].Seq {
			t.Fatalf("event %d replayed %+v, live %+v", i, replay[i], live[i])
		}
	}
}

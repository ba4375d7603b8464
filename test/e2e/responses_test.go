package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// respEvent is one event of a background response's stream (docs/responses.md).
type respEvent struct {
	Type     string `json:"type"`
	Seq      int    `json:"sequence_number"`
	Delta    string `json:"delta"`
	Code     string `json:"code"`
	Response struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	} `json:"response"`
}

// respEvents decodes relayed events.
func respEvents(t *testing.T, raw []string) []respEvent {
	t.Helper()
	out := make([]respEvent, 0, len(raw))
	for _, block := range raw {
		var ev respEvent
		for line := range strings.SplitSeq(block, "\n") {
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					t.Fatalf("event %q: %v", block, err)
				}
			}
		}
		out = append(out, ev)
	}
	return out
}

// textOf checks that evs are numbered on from first with no gap, carry id, and come from one
// attempt (one response.created), and returns their deltas' text.
func textOf(t *testing.T, evs []respEvent, first int, id string) string {
	t.Helper()
	var b strings.Builder
	created := 0
	for i, ev := range evs {
		if ev.Seq != first+i || (ev.Response.ID != "" && ev.Response.ID != id) {
			t.Fatalf("event %d: sequence_number %d (want %d), response id %q (want %s)", i, ev.Seq, first+i, ev.Response.ID, id)
		}
		if ev.Type == "response.created" {
			created++
		}
		if ev.Type == "response.output_text.delta" {
			b.WriteString(ev.Delta)
		}
	}
	if created > 1 {
		t.Fatalf("the stream has %d response.created events: two attempts mixed", created)
	}
	return b.String()
}

var respWords = strings.Fields(strings.Repeat("tick tock ", 12))

// createStreamed posts a background response with stream true and returns the answer, unread.
func (p *gatewayProcess) createStreamed(t *testing.T, headers ...string) *http.Response {
	t.Helper()
	body := fmt.Sprintf(`{"model":"demo","input":%q,"background":true,"stream":true}`, strings.Join(respWords, " "))
	req, err := http.NewRequest("POST", p.base+"/v1/responses", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return doStream(t, req, headers...)
}

// followResponse opens response id's stream on p after sequence number after (-1: from the
// start).
func (p *gatewayProcess) followResponse(t *testing.T, id string, after int, headers ...string) *http.Response {
	t.Helper()
	url := p.base + "/v1/responses/" + id + "?stream=true"
	if after >= 0 {
		url += fmt.Sprintf("&starting_after=%d", after)
	}
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return doStream(t, req, headers...)
}

// awaitResponse polls response id on p until it is final and returns its status and text.
func (p *gatewayProcess) awaitResponse(t *testing.T, id string, headers ...string) (status, text string) {
	t.Helper()
	testkit.WaitFor(t, 60*time.Second, "response "+id+" finished", func() bool {
		resp, b, err := p.send("GET", "/v1/responses/"+id, "", "", headers...)
		if err != nil || resp.StatusCode != 200 {
			return false
		}
		var o struct {
			Status string
			Output []struct {
				Content []struct{ Text string }
			}
		}
		if json.Unmarshal(b, &o) != nil {
			t.Fatalf("retrieve: %s", b)
		}
		status, text = o.Status, ""
		for _, it := range o.Output {
			for _, c := range it.Content {
				text += c.Text
			}
		}
		return status != "queued" && status != "in_progress"
	})
	return status, text
}

// TestKilledGatewayFinishesABackgroundResponse kills the real process (SIGKILL) while a
// background response streams, and restarts it on the same data directory: the accepted
// response is not lost, it completes, and its stream then reads whole from the one attempt
// that finished; a further restart runs nothing again.
func TestKilledGatewayFinishesABackgroundResponse(t *testing.T) {
	t.Parallel()
	model, upstream := startModelServer(t, modelserver.Config{ChunkDelay: 100 * time.Millisecond})
	p := newGatewayProcess(t, upstream, "responses /v1")
	p.start()
	want := "You said: " + strings.Join(respWords, " ")
	auth := []string{"Authorization", "Bearer crash"}

	first := p.createStreamed(t, auth...)
	raw, err := sseEvents(bufio.NewReader(first.Body), 7)
	if err != nil || len(raw) != 7 {
		t.Fatalf("before the crash: %d events, %v", len(raw), err)
	}
	head := respEvents(t, raw)
	id := head[0].Response.ID
	if head[0].Type != "response.queued" || !strings.HasPrefix(id, "resp_") {
		t.Fatalf("first event %+v", head[0])
	}
	p.kill()
	p.start()

	status, text := p.awaitResponse(t, id, auth...)
	if status != "completed" || text != want {
		t.Fatalf("after the restart: %s %q, want completed %q", status, text, want)
	}
	all, err := streamed(p.followResponse(t, id, -1, auth...))
	if err != nil {
		t.Fatal(err)
	}
	evs := respEvents(t, all)
	if got := textOf(t, evs, 0, id); got != want || evs[len(evs)-1].Type != "response.completed" {
		t.Fatalf("the finished stream reads %q ending %+v, want %q", got, evs[len(evs)-1], want)
	}
	if runs := model.Stats().Received; runs != 2 {
		t.Fatalf("the upstream ran %d times, want 2 (one cut by the crash, one to the end)", runs)
	}
	p.kill()
	p.start()
	if status, text := p.awaitResponse(t, id, auth...); status != "completed" || text != want {
		t.Fatalf("after a second restart: %s %q", status, text)
	}
	if runs := model.Stats().Received; runs != 2 {
		t.Fatalf("a finished response ran again: %d upstream runs", runs)
	}
}

// A background response streamed by one replica is resumed on another with starting_after,
// live from the recording in PostgreSQL, every later event once; a third replica replays it
// whole once finished, and cancels another response running elsewhere. The model ran once per
// response.
func TestBackgroundResponseResumesOnAnotherReplica(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{ChunkDelay: 100 * time.Millisecond})
	rs := startReplicas(t, 3, upstream, dsn, "responses /v1")
	auth := []string{"Authorization", "Bearer replicas"}
	want := "You said: " + strings.Join(respWords, " ")

	first := rs[0].createStreamed(t, auth...)
	raw, err := sseEvents(bufio.NewReader(first.Body), 7)
	if err != nil || len(raw) != 7 {
		t.Fatalf("before the drop: %d events, %v", len(raw), err)
	}
	first.Body.Close() // the client loses its connection mid-answer
	head := respEvents(t, raw)
	id := head[0].Response.ID
	text := textOf(t, head, 0, id)

	rest, err := streamed(rs[1].followResponse(t, id, 6, auth...))
	if err != nil {
		t.Fatal(err)
	}
	tail := respEvents(t, rest)
	text += textOf(t, tail, 7, id)
	if text != want || tail[len(tail)-1].Type != "response.completed" {
		t.Fatalf("resumed on another replica: %q ending %+v, want %q", text, tail[len(tail)-1], want)
	}
	whole, err := streamed(rs[2].followResponse(t, id, -1, auth...))
	if err != nil || textOf(t, respEvents(t, whole), 0, id) != want || len(whole) != len(raw)+len(rest) {
		t.Fatalf("replayed on a third replica: %d events (%v), want %d", len(whole), err, len(raw)+len(rest))
	}
	if runs := model.Stats().Received; runs != 1 {
		t.Fatalf("the model ran %d times, want 1", runs)
	}

	resp, b, err := rs[0].send("POST", "/v1/responses", "", `{"input":"long","background":true}`, append([]string{"X-Mock-Latency", "30s"}, auth...)...)
	var long struct{ ID string }
	if err != nil || resp.StatusCode != 200 || json.Unmarshal(b, &long) != nil {
		t.Fatalf("create: %v %v %s", err, resp, b)
	}
	testkit.WaitFor(t, 10*time.Second, "the long response runs", func() bool { return model.Stats().InFlight == 1 })
	for i := range 2 {
		resp, b, err := rs[1+i].send("POST", "/v1/responses/"+long.ID+"/cancel", "", "", auth...)
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), `"status":"cancelled"`) {
			t.Fatalf("cancel %d on another replica: %v %v %s", i+1, err, resp, b)
		}
	}
	testkit.WaitFor(t, 10*time.Second, "the upstream call was cut", func() bool {
		st := model.Stats()
		return st.InFlight == 0 && st.Abandoned == 1
	})

	// Deleted on one replica, it is gone on every one; another scope never saw it.
	if status, got := rs[0].awaitResponse(t, id, auth...); status != "completed" || got != want {
		t.Fatalf("retrieved on replica 0: %s %q", status, got)
	}
	if resp, _, err := rs[1].send("GET", "/v1/responses/"+id, "", "", "Authorization", "Bearer other"); err != nil || resp.StatusCode != 404 {
		t.Fatalf("another scope's retrieve: %v %v", err, resp)
	}
	if resp, b, err := rs[2].send("DELETE", "/v1/responses/"+id, "", "", auth...); err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), `"deleted":true`) {
		t.Fatalf("delete: %v %v %s", err, resp, b)
	}
	for i, r := range rs {
		if resp, b, err := r.send("GET", "/v1/responses/"+id, "", "", auth...); err != nil || resp.StatusCode != 404 || !strings.Contains(string(b), "RESPONSE_NOT_FOUND") {
			t.Fatalf("replica %d after the delete: %v %v %s", i, err, resp, b)
		}
	}
}

// The official openai SDK creates a streamed background response on one replica, drops it
// after three deltas, and resumes it on another with responses.retrieve(id, {stream: true,
// starting_after}): every later event once, numbered on, the text whole, the model run once.
func TestOpenAINodeSDKResumesABackgroundStreamOnAnotherReplica(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node, script := testkit.InstallSDKScript(t, ctx, filepath.Join(testkit.ModuleRoot(), "module", "testdata", "openai_responses.cjs"))
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{})
	rs := startReplicas(t, 2, upstream, dsn, "responses /v1")
	type sdkEvent struct {
		Type, Delta, ID string
		Seq             int
	}
	var got struct {
		Stream struct {
			ID          string
			First, Rest []sdkEvent
		}
	}
	out := testkit.RunSDKScript(t, ctx, node, script, "resume", rs[0].base+"/v1", rs[1].base+"/v1")
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("the script printed %q: %v", out, err)
	}
	s := got.Stream
	events := func(in []sdkEvent) []respEvent {
		out := make([]respEvent, len(in))
		for i, e := range in {
			out[i] = respEvent{Type: e.Type, Seq: e.Seq, Delta: e.Delta}
			out[i].Response.ID = e.ID
		}
		return out
	}
	text := textOf(t, events(s.First), 0, s.ID) + textOf(t, events(s.Rest), len(s.First), s.ID)
	if want := "You said: one two three four five six seven eight"; text != want || s.Rest[len(s.Rest)-1].Type != "response.completed" {
		t.Fatalf("dropped on one replica and resumed on the other: %q, want %q", text, want)
	}
	if runs := model.Stats().Received; runs != 1 {
		t.Fatalf("the model ran %d times, want 1", runs)
	}
}

// The replica running a background response dies (SIGKILL) while another replica's client
// follows its stream from the recording in PostgreSQL: the follower gets stream_attempt_lost,
// never the next attempt's events after the lost one's; the surviving replica takes the
// response over and completes it, and its stream then reads whole from that one attempt.
func TestFollowerOfAKilledReplicasResponseSeesTheAttemptLost(t *testing.T) {
	// Not in parallel: a replica must start and follow before the stream ends.
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{ChunkDelay: 200 * time.Millisecond})
	block := "responses /v1\nasync {\n takeover 3s\n}"
	auth := []string{"Authorization", "Bearer takeover"}
	runner := newReplica(t, upstream, dsn, block)
	runner.start() // alone, it takes the response
	first := runner.createStreamed(t, auth...)
	raw, err := sseEvents(bufio.NewReader(first.Body), 6)
	if err != nil || len(raw) != 6 {
		t.Fatalf("before the follower: %d events, %v", len(raw), err)
	}
	id := respEvents(t, raw)[0].Response.ID
	survivor := newReplica(t, upstream, dsn, block)
	survivor.start()
	follow := survivor.followResponse(t, id, 5, auth...)
	rd := bufio.NewReader(follow.Body)
	more, err := sseEvents(rd, 2)
	if err != nil || len(more) != 2 {
		t.Fatalf("following on the other replica: %d events, %v", len(more), err)
	}
	runner.kill()
	rest, err := sseEvents(rd, 0)
	if err != nil {
		t.Fatalf("after the kill: %v", err)
	}
	evs := respEvents(t, append(more, rest...))
	last := evs[len(evs)-1]
	textOf(t, evs, 6, id)
	if last.Type != "error" || last.Code != "stream_attempt_lost" {
		t.Fatalf("the follower of the killed replica's attempt ended with %+v", last)
	}
	want := "You said: " + strings.Join(respWords, " ")
	if status, text := survivor.awaitResponse(t, id, auth...); status != "completed" || text != want {
		t.Fatalf("after the takeover: %s %q", status, text)
	}
	whole, err := streamed(survivor.followResponse(t, id, -1, auth...))
	if err != nil || textOf(t, respEvents(t, whole), 0, id) != want {
		t.Fatalf("the finished stream: %d events, %v", len(whole), err)
	}
	if runs := model.Stats().Received; runs != 2 {
		t.Fatalf("the upstream ran %d times, want 2 (one cut by the kill, one after the takeover)", runs)
	}
}

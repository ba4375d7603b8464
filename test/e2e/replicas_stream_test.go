package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// sseEvents reads whole events (blocks ending in a blank line, as relayed) until n have come
// (n <= 0: to the end). err is nil only after n events or at a clean end.
func sseEvents(rd *bufio.Reader, n int) ([]string, error) {
	var out []string
	var block strings.Builder
	for n <= 0 || len(out) < n {
		line, err := rd.ReadString('\n')
		block.WriteString(line)
		if err != nil {
			if err == io.EOF && block.Len() == 0 {
				return out, nil
			}
			return out, err
		}
		if strings.TrimRight(line, "\r\n") == "" {
			out = append(out, block.String())
			block.Reset()
		}
	}
	return out, nil
}

// eventID is the id line's value of a relayed event.
func eventID(event string) string {
	for line := range strings.SplitSeq(event, "\n") {
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			return strings.TrimRight(v, "\r")
		}
	}
	return ""
}

// A keyed stream relayed by one replica is joined, resumed and replayed through the others
// from the recording in PostgreSQL (docs/streams.md): the client drops on replica 0 after 5
// events, its retry lands on replica 1 and gets the whole stream from the first event, a
// Last-Event-ID resume on replica 2 gets the rest after event 4, and after the end every
// replica replays the same bytes. The model ran once.
func TestStreamIsJoinedResumedAndReplayedAcrossReplicas(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{ChunkDelay: 100 * time.Millisecond})
	rs := startReplicas(t, 3, upstream, dsn, "")
	whole := len(streamWords) + 2 + 1 // "You said:" and [DONE]

	first := rs[0].openStream(t, "s")
	head, err := sseEvents(bufio.NewReader(first.Body), 5)
	if err != nil || len(head) != 5 {
		t.Fatalf("before the drop: %d events, %v", len(head), err)
	}
	first.Body.Close() // the client loses its connection mid-answer

	var (
		wg             sync.WaitGroup
		joined, resume []string
		jerr, rerr     error
		jresp, rresp   *http.Response
	)
	wg.Go(func() {
		jresp = rs[1].openStream(t, "s")
		joined, jerr = sseEvents(bufio.NewReader(jresp.Body), 0)
	})
	wg.Go(func() {
		rresp = rs[2].openStream(t, "s", "Last-Event-ID", eventID(head[3]))
		resume, rerr = sseEvents(bufio.NewReader(rresp.Body), 0)
	})
	wg.Wait()
	t.Logf("join on replica 1: %d %d events (%v); resume after %q on replica 2: %d %d events (%v)",
		jresp.StatusCode, len(joined), jerr, eventID(head[3]), rresp.StatusCode, len(resume), rerr)
	if jerr != nil || jresp.StatusCode != 200 || len(joined) != whole {
		t.Fatalf("the join on another replica got %d: %d of %d events, %v", jresp.StatusCode, len(joined), whole, jerr)
	}
	if strings.Join(joined[:5], "") != strings.Join(head, "") {
		t.Fatalf("the join's first events differ from what the first client read:\n%q\n%q", joined[:5], head)
	}
	if rerr != nil || rresp.StatusCode != 200 || strings.Join(resume, "") != strings.Join(joined[4:], "") {
		t.Fatalf("the resume after event 4 on another replica got %d: %d events (%v), want events 5 to %d", rresp.StatusCode, len(resume), rerr, whole)
	}
	for i, r := range rs {
		resp := r.openStream(t, "s")
		all, err := sseEvents(bufio.NewReader(resp.Body), 0)
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || strings.Join(all, "") != strings.Join(joined, "") {
			t.Fatalf("replica %d replays %d %q: %d events (%v), not the stream", i, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), len(all), err)
		}
	}
	if runs := model.Stats().ByKey["s"]; runs != 1 {
		t.Fatalf("the model ran %d times for the key, want 1", runs)
	}
}

// follow opens operation id's result on p as Server-Sent Events, with extra header pairs.
func (p *gatewayProcess) follow(t *testing.T, id string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", p.base+"/v1/operations/"+id+"/result", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	return doStream(t, req, headers...)
}

// streamed reads a streamed answer's events to the end; an answer other than 200 is an error.
func streamed(resp *http.Response) ([]string, error) {
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	return sseEvents(bufio.NewReader(resp.Body), 0)
}

// An async operation whose answer streams is followed live through every replica, not only
// the one running it: its progress shows on each, a follower on each gets the events so far
// and then the live ones to the same end, and Last-Event-ID resumes there too. It ran once.
func TestAsyncStreamIsFollowedThroughEveryReplica(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{ChunkDelay: 100 * time.Millisecond})
	rs := startReplicas(t, 3, upstream, dsn, "")
	whole := len(streamWords) + 2 + 1
	body := fmt.Sprintf(`{"stream":true,"messages":[{"role":"user","content":%q}]}`, strings.Join(streamWords, " "))
	resp, b, err := rs[0].send("POST", "/v1/chat/completions", "op-stream", body, "Prefer", "respond-async")
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: %v %v %s", err, resp, b)
	}
	var op operation
	if err := json.Unmarshal(b, &op); err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		testkit.WaitFor(t, 15*time.Second, fmt.Sprintf("progress on replica %d", i), func() bool {
			_, b, err := r.send("GET", "/v1/operations/"+op.OperationID, "", "")
			var v struct {
				Progress *struct {
					Events int `json:"events"`
				} `json:"progress"`
			}
			return err == nil && json.Unmarshal(b, &v) == nil && v.Progress != nil && v.Progress.Events >= 3
		})
	}
	got := make([][]string, len(rs))
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			var headers []string
			if i == 2 {
				headers = []string{"Last-Event-ID", "2"}
			}
			got[i], errs[i] = streamed(r.follow(t, op.OperationID, headers...))
		})
	}
	wg.Wait()
	for i := range rs {
		t.Logf("replica %d: %d events, %v", i, len(got[i]), errs[i])
	}
	if errs[0] != nil || len(got[0]) != whole {
		t.Fatalf("replica 0's follower got %d of %d events: %v", len(got[0]), whole, errs[0])
	}
	if errs[1] != nil || strings.Join(got[1], "") != strings.Join(got[0], "") {
		t.Fatalf("replica 1's follower got %d events (%v), not the same stream", len(got[1]), errs[1])
	}
	if errs[2] != nil || strings.Join(got[2], "") != strings.Join(got[0][2:], "") {
		t.Fatalf("replica 2's resume after event 2 got %d events (%v), want events 3 to %d", len(got[2]), errs[2], whole)
	}
	if final := rs[1].await(t, op.OperationID, 15*time.Second); final.Status != "succeeded" {
		t.Fatalf("operation %s", final.Status)
	}
	if runs := model.Stats().ByKey["op-stream"]; runs != 1 {
		t.Fatalf("the model ran %d times, want 1", runs)
	}
}

// A duplicate on another replica, sent before the model's first token, waits for the stream
// to begin and joins it from the store; the model runs once.
func TestDuplicateOnAnotherReplicaBeforeTheStreamBeginsJoinsIt(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{Latency: time.Second, ChunkDelay: 20 * time.Millisecond})
	rs := startReplicas(t, 2, upstream, dsn, "")
	whole := len(streamWords) + 2 + 1
	got := make([][]string, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, r := range rs {
		if i == 1 { // the first is in flight, its answer a second away
			testkit.WaitFor(t, 15*time.Second, "the first call at the model", func() bool { return model.Stats().InFlight == 1 })
		}
		wg.Go(func() { got[i], errs[i] = streamed(r.openStream(t, "early")) })
	}
	wg.Wait()
	for i := range rs {
		if errs[i] != nil || len(got[i]) != whole {
			t.Fatalf("replica %d: %d of %d events, %v", i, len(got[i]), whole, errs[i])
		}
	}
	if strings.Join(got[0], "") != strings.Join(got[1], "") {
		t.Fatal("the two replicas relayed different streams")
	}
	if runs := model.Stats().ByKey["early"]; runs != 1 {
		t.Fatalf("the model ran %d times, want 1", runs)
	}
}

// droppedStreams counts the recorded streams marked aborted in the database: dropped past
// max_result, or abandoned.
func droppedStreams(t *testing.T, dsn string) int {
	t.Helper()
	return pgtest.Count(t, dsn, `SELECT count(*) FROM stream_heads WHERE state = 3`)
}

// A stream over max_result is relayed to its first client but not recorded: it is dropped from
// the store when it passes the limit, so a duplicate on another replica does not join it (and
// stall there with nothing more to come); it waits for the first attempt to end and then runs
// the request itself, and gets a whole stream.
func TestUnrecordedStreamIsNotJoinedThroughAnotherReplica(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{ChunkDelay: 100 * time.Millisecond})
	rs := startReplicas(t, 2, upstream, dsn, "async {\n\t\t\tmax_result 1200B\n\t\t}")
	whole := len(streamWords) + 2 + 1
	first := rs[0].openStream(t, "big")
	rd := bufio.NewReader(first.Body)
	if head, err := sseEvents(rd, 3); err != nil || len(head) != 3 {
		t.Fatalf("first client: %d events, %v", len(head), err)
	}
	firstDone := make(chan int, 1)
	go func() { // the first client reads on to the end
		rest, _ := sseEvents(rd, 0)
		firstDone <- 3 + len(rest)
	}()
	// Past max_result (about 6 events) the recording is dropped from the store.
	testkit.WaitFor(t, 15*time.Second, "the recording dropped", func() bool { return droppedStreams(t, dsn) == 1 })
	dup, err := streamed(rs[1].openStream(t, "big"))
	if n := <-firstDone; n != whole {
		t.Fatalf("the first client got %d of %d events", n, whole)
	}
	if err != nil || len(dup) != whole {
		t.Fatalf("the duplicate on replica 1 got %d of %d events (%v): it joined a stream that is not recorded", len(dup), whole, err)
	}
	if runs := model.Stats().ByKey["big"]; runs != 2 {
		t.Fatalf("the model ran %d times, want 2 (the unrecorded stream, then the duplicate's own)", runs)
	}
}

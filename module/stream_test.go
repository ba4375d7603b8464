package module

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/sse"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// eventUpstream is a model server's streaming endpoint in miniature: every request is one
// execution that answers `events` Server-Sent Events, each flushed at once.
type eventUpstream struct {
	events  int
	holdAt  int           // after this many events, wait until resume is closed (0: never)
	resume  chan struct{} // closed by release
	once    sync.Once
	breakAt int  // the first execution breaks off after this many events (0: never)
	ownIDs  bool // the upstream names its events itself
	size    int  // padding per event, to make streams large
	// holdHead: every execution waits until resume is closed before it answers at all, as
	// a model server does until its first token.
	holdHead bool
	// head, when set, holds every execution's answer until it is closed, as holdHead does with
	// resume (which then holds at holdAt only).
	head chan struct{}
	runs atomic.Int64
}

func newEventUpstream(events int) *eventUpstream {
	return &eventUpstream{events: events, resume: make(chan struct{})}
}

// release lets held executions go on. A test registers it as a cleanup too, so that a test
// that fails while the upstream holds does not leave it holding past the end.
func (u *eventUpstream) release() { u.once.Do(func() { close(u.resume) }) }

func (u *eventUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	run := u.runs.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	if u.holdHead || u.head != nil {
		gate := u.resume
		if u.head != nil {
			gate = u.head
		}
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for i := 1; i <= u.events; i++ {
		if u.ownIDs {
			fmt.Fprintf(w, "id: evt-%d\n", i)
		}
		fmt.Fprintf(w, "data: {\"n\":%d,\"run\":%d,\"pad\":%q}\n\n", i, run, strings.Repeat("x", u.size))
		_ = rc.Flush()
		if i == u.holdAt {
			select {
			case <-u.resume:
			case <-r.Context().Done():
				return
			}
		}
		if run == 1 && i == u.breakAt {
			panic(http.ErrAbortHandler) // the connection drops mid-answer
		}
	}
}

// sseEvent is one event as a client read it.
type sseEvent struct {
	id, data string
	raw      string
}

// sseStream is a streamed response being read event by event.
type sseStream struct {
	resp *http.Response
	rd   *bufio.Reader
}

// openStream posts a streaming request with key and extra headers.
func (g *gateway) openStream(key string, headers ...string) *sseStream {
	g.t.Helper()
	req, err := http.NewRequest("POST", g.base+chatPath, strings.NewReader(`{"model":"demo","stream":true,"messages":[]}`))
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return g.stream(req, headers...)
}

// followOperation opens an operation's result as Server-Sent Events.
func (g *gateway) followOperation(id, query string, headers ...string) *sseStream {
	g.t.Helper()
	req, err := http.NewRequest("GET", g.base+"/v1/operations/"+id+"/result"+query, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	return g.stream(req, headers...)
}

// stream sends req with extra headers and expects an event stream.
func (g *gateway) stream(req *http.Request, headers ...string) *sseStream {
	g.t.Helper()
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := g.client.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	if resp.StatusCode != 200 || !sse.IsEventStream(resp.Header.Get("Content-Type")) {
		b, _ := io.ReadAll(resp.Body)
		g.t.Fatalf("stream answered %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	g.t.Cleanup(func() { resp.Body.Close() })
	return &sseStream{resp: resp, rd: bufio.NewReader(resp.Body)}
}

// read returns the next event; io.EOF at a clean end.
func (s *sseStream) read() (sseEvent, error) {
	var e sseEvent
	var raw strings.Builder
	for {
		line, err := s.rd.ReadString('\n')
		raw.WriteString(line)
		if err != nil {
			if err == io.EOF && raw.Len() > 0 {
				err = io.ErrUnexpectedEOF
			}
			return e, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			e.raw = raw.String()
			return e, nil
		case strings.HasPrefix(line, "id: "):
			e.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			e.data = strings.TrimPrefix(line, "data: ")
		}
	}
}

// readN reads n events.
func (s *sseStream) readN(t *testing.T, n int) []sseEvent {
	t.Helper()
	var out []sseEvent
	for range n {
		e, err := s.read()
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		out = append(out, e)
	}
	return out
}

// readAll reads to the end, and reports how it ended (nil: a clean end).
func (s *sseStream) readAll() ([]sseEvent, error) {
	var out []sseEvent
	for {
		e, err := s.read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
}

// checkEvents checks that events are the stream's events from..to of execution run, in order,
// each with an id.
func checkEvents(t *testing.T, evs []sseEvent, from, to int, run int64, ownIDs bool) {
	t.Helper()
	if len(evs) != to-from+1 {
		t.Fatalf("got %d events, want %d to %d: %v", len(evs), from, to, evs)
	}
	for i, e := range evs {
		n := from + i
		wantID := fmt.Sprint(n)
		if ownIDs {
			wantID = fmt.Sprintf("evt-%d", n)
		}
		if e.id != wantID || !strings.HasPrefix(e.data, fmt.Sprintf(`{"n":%d,"run":%d,`, n, run)) {
			t.Fatalf("event %d: id %q data %q, want id %q of run %d", n, e.id, e.data, wantID, run)
		}
	}
}

func joinRaw(evs []sseEvent) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(e.raw)
	}
	return b.String()
}

func TestDroppedStreamIsJoinedOnRetryAndReplaysWhenFinished(t *testing.T) {
	up := newEventUpstream(20)
	up.holdAt = 5
	g := startGatewayWith(t, gatewaySetup{upstream: up})
	t.Cleanup(up.release)

	first := g.openStream("k")
	checkEvents(t, first.readN(t, 5), 1, 5, 1, false)
	first.resp.Body.Close() // the client drops mid-answer

	retry := g.openStream("k")
	if retry.resp.Header.Get(headerReplayed) != "true" {
		t.Fatalf("the joined stream is not marked replayed: %v", retry.resp.Header)
	}
	head := retry.readN(t, 5)
	up.release()
	rest, err := retry.readAll()
	if err != nil {
		t.Fatal(err)
	}
	all := append(head, rest...)
	checkEvents(t, all, 1, 20, 1, false)

	third := g.openStream("k")
	replayed, err := third.readAll()
	if err != nil || third.resp.Header.Get(headerReplayed) != "true" || third.resp.Header.Get(headerExpires) == "" {
		t.Fatalf("replay: %v, headers %v", err, third.resp.Header)
	}
	if joinRaw(replayed) != joinRaw(all) {
		t.Fatalf("the replay differs from the joined stream:\n%s\n%s", joinRaw(replayed), joinRaw(all))
	}
	if n := up.runs.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

// heldHeadGateway is a gateway in front of an upstream answering events events, whose every
// execution waits before it answers at all until the test releases it.
func heldHeadGateway(t *testing.T, events int) (*eventUpstream, *gateway) {
	up := newEventUpstream(events)
	up.holdHead = true
	g := startGatewayWith(t, gatewaySetup{upstream: up})
	t.Cleanup(up.release)
	return up, g
}

// A duplicate that arrives before the first attempt's answer has begun (the model has not
// produced its first token) waits for it and joins it, instead of 409; the upstream runs once.
func TestDuplicateBeforeTheStreamBeginsWaitsAndJoinsIt(t *testing.T) {
	up, g := heldHeadGateway(t, 20)
	type answer struct {
		status int
		events []sseEvent
		err    error
	}
	answers := make(chan answer, 2)
	send := func() {
		req, _ := http.NewRequest("POST", g.base+chatPath, strings.NewReader(`{"model":"demo","stream":true,"messages":[]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "early")
		resp, err := g.client.Do(req)
		if err != nil {
			answers <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		evs, err := (&sseStream{resp: resp, rd: bufio.NewReader(resp.Body)}).readAll()
		answers <- answer{status: resp.StatusCode, events: evs, err: err}
	}
	go send()
	testkit.WaitFor(t, 5*time.Second, "up.runs.Load() == 1", func() bool { return up.runs.Load() == 1 })
	go send()
	testkit.WaitFor(t, 10*time.Second, "the duplicate waiting for the stream to begin", func() bool { return streams.FlightWaiters() == 1 })
	up.release()
	for range 2 {
		a := <-answers
		if a.err != nil || a.status != 200 {
			t.Fatalf("answer %d, %v: %v", a.status, a.err, a.events)
		}
		checkEvents(t, a.events, 1, 20, 1, false)
	}
	if n := up.runs.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

// At most streams.MaxFlightWaiters duplicates of one key wait for its stream to begin; the ones past
// that are answered 409 at once, and the ones that waited join the stream.
func TestWaitingStreamDuplicatesAreBounded(t *testing.T) {
	up, g := heldHeadGateway(t, 5)
	statuses := make(chan int, streams.MaxFlightWaiters+7)
	send := func() {
		r := g.post(chatPath, "crowd", `{"model":"demo","stream":true,"messages":[]}`)
		if r.err != nil {
			statuses <- 0
			return
		}
		if r.StatusCode == 200 && strings.Count(string(r.body), "data: ") != 5 {
			statuses <- -1
			return
		}
		statuses <- r.StatusCode
	}
	go send()
	testkit.WaitFor(t, 5*time.Second, "up.runs.Load() == 1", func() bool { return up.runs.Load() == 1 })
	for range streams.MaxFlightWaiters + 6 {
		go send()
	}
	// The ones past the bound are answered at once; the others are counted waiting. Any of them
	// answered before the release would show in the counts below.
	testkit.WaitFor(t, 5*time.Second, "len(statuses) == 6 && streams.FlightWaiters() == streams.MaxFlightWaiters", func() bool { return len(statuses) == 6 && streams.FlightWaiters() == streams.MaxFlightWaiters })
	up.release()
	count := map[int]int{}
	for range streams.MaxFlightWaiters + 7 {
		count[<-statuses]++
	}
	if count[http.StatusConflict] != 6 || count[200] != streams.MaxFlightWaiters+1 || up.runs.Load() != 1 {
		t.Fatalf("answers by status %v (0: no answer, -1: not the whole stream), upstream runs %d", count, up.runs.Load())
	}
}

func TestLastEventIDResumesAfterThatEvent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		live   bool
		ownIDs bool
	}{
		{"finished, gateway ids", false, false},
		{"finished, upstream ids", false, true},
		{"live, gateway ids", true, false},
		{"live, upstream ids", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newEventUpstream(20)
			up.ownIDs = tc.ownIDs
			if tc.live {
				up.holdAt = 8
			} else {
				up.release()
			}
			g := startGatewayWith(t, gatewaySetup{upstream: up})
			t.Cleanup(up.release)
			first := g.openStream("k")
			seen := first.readN(t, 8)
			if !tc.live {
				if _, err := first.readAll(); err != nil {
					t.Fatal(err)
				}
			}
			resumed := g.openStream("k", headerLastEventID, seen[3].id)
			if tc.live {
				checkEvents(t, resumed.readN(t, 4), 5, 8, 1, tc.ownIDs)
				up.release()
			}
			rest, err := resumed.readAll()
			if err != nil {
				t.Fatal(err)
			}
			from := 5
			if tc.live {
				from = 9
			}
			checkEvents(t, rest, from, 20, 1, tc.ownIDs)
			if n := up.runs.Load(); n != 1 {
				t.Fatalf("the upstream ran %d times, want 1", n)
			}
		})
	}
}

func TestFiftyJoinersOfOneLiveStreamGetIdenticalCompleteStreams(t *testing.T) {
	up := newEventUpstream(20)
	up.holdAt = 3
	g := startGatewayWith(t, gatewaySetup{upstream: up})
	t.Cleanup(up.release)
	first := g.openStream("k")
	head := first.readN(t, 3)

	const joiners = 50
	joined := make(chan struct{}, joiners)
	results := make([]string, joiners)
	errs := make([]error, joiners)
	var wg sync.WaitGroup
	for i := range joiners {
		s := g.openStream("k")
		wg.Go(func() {
			evs := s.readN(t, 1)
			joined <- struct{}{}
			rest, err := s.readAll()
			results[i], errs[i] = joinRaw(append(evs, rest...)), err
		})
	}
	for range joiners {
		<-joined
	}
	up.release()
	rest, err := first.readAll()
	if err != nil {
		t.Fatal(err)
	}
	want := joinRaw(append(head, rest...))
	wg.Wait()
	for i := range joiners {
		if errs[i] != nil || results[i] != want {
			t.Fatalf("joiner %d (err %v) got a different stream:\n%s\nwant\n%s", i, errs[i], results[i], want)
		}
	}
	if n := up.runs.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

func TestStreamThatBreaksOffIsNotReplayedAndItsKeyIsReleased(t *testing.T) {
	up := newEventUpstream(20)
	up.holdAt, up.breakAt = 5, 10
	g := startGatewayWith(t, gatewaySetup{upstream: up})
	t.Cleanup(up.release)
	first := g.openStream("k")
	head := first.readN(t, 5)
	joiner := g.openStream("k")
	joiner.readN(t, 5)
	up.release()

	for name, s := range map[string]*sseStream{"first client": first, "joiner": joiner} {
		evs, err := s.readAll()
		if err == nil {
			t.Fatalf("the %s saw a clean end after %d events: a broken stream passed for whole", name, len(evs))
		}
	}
	retry := g.openStream("k")
	if retry.resp.Header.Get(headerReplayed) != "" {
		t.Fatal("the broken stream was replayed")
	}
	all, err := retry.readAll()
	if err != nil {
		t.Fatal(err)
	}
	checkEvents(t, all, 1, 20, 2, false)
	checkEvents(t, head, 1, 5, 1, false)
	if n := up.runs.Load(); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2", n)
	}
}

func TestStreamOverMaxResultIsRelayedButNotRecorded(t *testing.T) {
	up := newEventUpstream(20)
	up.size = 200
	up.release()
	g := startGatewayWith(t, gatewaySetup{upstream: up, mulligan: "async {\n max_result 2KiB\n}"})
	t.Cleanup(up.release)
	evs, err := g.openStream("k").readAll()
	if err != nil {
		t.Fatal(err)
	}
	checkEvents(t, evs, 1, 20, 1, false)
	again := g.openStream("k")
	if _, err := again.readAll(); err != nil || again.resp.Header.Get(headerReplayed) != "" {
		t.Fatalf("second request: %v, replayed %q", err, again.resp.Header.Get(headerReplayed))
	}
	if n := up.runs.Load(); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2 (the key must be released)", n)
	}
}

func TestAsyncStreamIsFollowedWhileItRunsAndResumedAfterIt(t *testing.T) {
	up := newEventUpstream(20)
	up.holdAt = 5
	g := startGatewayWith(t, gatewaySetup{upstream: up})
	t.Cleanup(up.release)
	_, op := g.submit(t, "")
	var progress struct {
		Progress *struct {
			Events int   `json:"events"`
			Bytes  int64 `json:"bytes"`
		} `json:"progress"`
	}
	testkit.WaitFor(t, 5*time.Second, "the progress of 5 events", func() bool {
		r := g.get("/v1/operations/" + op.OperationID)
		return json.Unmarshal(r.body, &progress) == nil && progress.Progress != nil && progress.Progress.Events == 5
	})
	if progress.Progress.Bytes < int64(5*len(`data: {"n":1,"run":1,"pad":""}`)) {
		t.Fatalf("progress of a running stream: %+v", *progress.Progress)
	}

	live := g.followOperation(op.OperationID, "", headerLastEventID, "2")
	checkEvents(t, live.readN(t, 3), 3, 5, 1, false)
	up.release()
	rest, err := live.readAll()
	if err != nil {
		t.Fatal(err)
	}
	checkEvents(t, rest, 6, 20, 1, false)

	if final := g.await(t, op.OperationID); final.Status != "succeeded" {
		t.Fatalf("operation %s", final.Status)
	}
	resumed, err := g.followOperation(op.OperationID, "?starting_after=17").readAll()
	if err != nil {
		t.Fatal(err)
	}
	checkEvents(t, resumed, 18, 20, 1, false)
	if raw := g.get("/v1/operations/" + op.OperationID + "/result"); bytes.Contains(raw.body, []byte("id: ")) || !bytes.Contains(raw.body, []byte(`"n":20`)) {
		t.Fatalf("without Accept: text/event-stream the result must be the upstream's bytes as sent: %s", raw.body)
	}
	if n := up.runs.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

func TestAfterModeRelaysAStreamThatBeginsWithinTheWindowLive(t *testing.T) {
	up := newEventUpstream(20)
	up.holdAt = 5
	g := startGatewayWith(t, gatewaySetup{upstream: up, mulligan: "async {\n mode after 1s\n}"})
	t.Cleanup(up.release)
	live := g.openStream("k")
	if live.resp.Header.Get("Preference-Applied") != "" {
		t.Fatal("a stream that began within the window was converted")
	}
	head := live.readN(t, 5) // the upstream holds here: these came live, not after the window
	up.release()
	rest, err := live.readAll()
	if err != nil {
		t.Fatal(err)
	}
	all := append(head, rest...)
	checkEvents(t, all, 1, 20, 1, false)
	again := g.openStream("k")
	replayed, err := again.readAll()
	if err != nil || again.resp.Header.Get(headerReplayed) != "true" || joinRaw(replayed) != joinRaw(all) {
		t.Fatalf("the retry did not replay the stream as relayed: %v %v", err, again.resp.Header)
	}
	if n := up.runs.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

func TestRecordedStreamSaysWhenItExpiresInATrailer(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "async {\n max_result 2KiB\n}")
	for _, tc := range []struct {
		name, key, content string
		recorded           bool
	}{
		{"a recorded stream", "short", "one two three", true},
		{"a stream over max_result", "long", strings.Repeat("word ", 600), false},
	} {
		req, _ := http.NewRequest("POST", g.base+chatPath, strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"`+tc.content+`"}]}`))
		req.Header.Set("Idempotency-Key", tc.key)
		req.Header.Set("Content-Type", "application/json")
		r := g.do(req)
		if r.err != nil || r.StatusCode != 200 || r.Header.Get(headerExpires) != "" {
			t.Fatalf("%s: %v %v, header Idempotency-Expires %q", tc.name, r.err, r.Status, r.Header.Get(headerExpires))
		}
		if got := r.Trailer.Get(headerExpires) != ""; got != tc.recorded {
			t.Errorf("%s: trailer Idempotency-Expires %q, want it %v", tc.name, r.Trailer.Get(headerExpires), tc.recorded)
		}
	}
}

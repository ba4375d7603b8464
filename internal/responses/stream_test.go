package responses

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
)

// memStore is the Store of a test: operations and recorded answers in maps, each running
// attempt's stream a real streams.Broadcast.
type memStore struct {
	mu      sync.Mutex
	ops     map[string]*store.Operation
	live    map[string]*streams.Broadcast
	results map[string]*store.Response
	loads   int
}

func newMemStore(ops ...*store.Operation) *memStore {
	s := &memStore{ops: map[string]*store.Operation{}, live: map[string]*streams.Broadcast{}, results: map[string]*store.Response{}}
	for _, op := range ops {
		s.ops[op.ID] = op
	}
	return s
}

// set stores op as it now is.
func (s *memStore) set(op store.Operation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops[op.ID] = &op
}

// begin starts an attempt's event stream of id.
func (s *memStore) begin(id string) *streams.Broadcast {
	b := streams.NewBroadcast(nil)
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream")
	b.Open(http.StatusOK, h)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live[id] = b
	return b
}

func (s *memStore) GetOperation(id string) (*store.Operation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	op, ok := s.ops[id]
	if !ok {
		return nil, store.ErrNotFound
	}
	cp := *op
	return &cp, nil
}

func (s *memStore) Live(op *store.Operation) streams.Source {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.live[op.ID]; ok {
		return b
	}
	return nil
}

func (s *memStore) LoadResult(op *store.Operation, _ int64) (*store.Response, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loads++
	return s.results[op.ID], func() {}, nil
}

func (s *memStore) AwaitAnswer(op *store.Operation) *store.Operation {
	cur, err := s.GetOperation(op.ID)
	if err != nil {
		return op
	}
	return cur
}

// client is the other end of a followed stream: what the relay writes, read as it comes.
type client struct {
	h  http.Header
	pw *io.PipeWriter
	rd *bufio.Reader
}

func (c *client) Header() http.Header         { return c.h }
func (c *client) WriteHeader(int)             {}
func (c *client) Write(b []byte) (int, error) { return c.pw.Write(b) }
func (c *client) Flush()                      {}

// next reads the next block: an event, or a comment.
func (c *client) next(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for {
		line, err := c.rd.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended after %q: %v", b.String(), err)
		}
		if line == "\n" {
			return b.String()
		}
		b.WriteString(line)
	}
}

// event reads the next block as an event: its type and data.
func (c *client) event(t *testing.T) (typ string, data map[string]any) {
	t.Helper()
	block := c.next(t)
	typ, rest, ok := strings.Cut(strings.TrimPrefix(block, "event: "), "\ndata: ")
	if !ok || json.Unmarshal([]byte(rest), &data) != nil {
		t.Fatalf("not an event: %q", block)
	}
	return typ, data
}

// ended checks that the stream ends with nothing more.
func (c *client) ended(t *testing.T, done <-chan error) {
	t.Helper()
	if rest, err := io.ReadAll(c.rd); err != nil || len(rest) > 0 {
		t.Fatalf("after the end: %q %v", rest, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Follow: %v", err)
	}
}

// follow follows op from rd in the background; done has what Follow returned.
func follow(t *testing.T, rd *Reader, op *store.Operation, after int64) (*client, <-chan error) {
	pr, pw := io.Pipe()
	c := &client{h: http.Header{}, pw: pw, rd: bufio.NewReader(pr)}
	done := make(chan error, 1)
	go func() {
		err := rd.Follow(c, op, after)
		_ = pw.Close()
		done <- err
	}()
	t.Cleanup(func() { _ = pr.Close() })
	return c, done
}

func newReader(t *testing.T, st Store) (*Reader, *clockwork.FakeClock) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	clock := clockwork.NewFakeClock()
	return &Reader{Store: st, Clock: clock, Context: ctx, Objects: NewObjects()}, clock
}

func running() *store.Operation {
	return &store.Operation{ID: "resp_gw", Kind: Kind, Status: store.StatusRunning, SubmittedAt: time.Unix(7, 0), Version: 2}
}

// runningStream is a running response followed from its start: its store, the attempt's
// stream, the reader's clock and the client reading what Follow writes (done has what it
// returned).
type runningStream struct {
	op    *store.Operation
	st    *memStore
	b     *streams.Broadcast
	clock *clockwork.FakeClock
	c     *client
	done  <-chan error
}

// followRunning begins following a running response whose attempt has begun to stream.
func followRunning(t *testing.T) *runningStream {
	f := &runningStream{op: running()}
	f.st = newMemStore(f.op)
	f.b = f.st.begin(f.op.ID)
	var rd *Reader
	rd, f.clock = newReader(t, f.st)
	f.c, f.done = follow(t, rd, f.op, -1)
	return f
}

// blockUntil waits until n waiters are on the fake clock.
func blockUntil(t *testing.T, clock *clockwork.FakeClock, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clock.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("waiting for %d waiters on the clock: %v", n, err)
	}
}

const (
	created   = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_up\",\"status\":\"in_progress\"}}\n\n"
	delta     = "data: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\",\"sequence_number\":1}\n\n"
	completed = "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_up\",\"status\":\"completed\",\"created_at\":5}}\n\n"
)

// The stream begins with the response as created, numbered 0; the attempt's events follow,
// renumbered on and carrying the gateway's id and creation time; a terminal event ends it.
func TestFollowRenumbersTheAttemptsEventsAfterTheQueuedOne(t *testing.T) {
	f := followRunning(t)
	if typ, d := f.c.event(t); typ != "response.queued" || d["sequence_number"] != 0.0 || d["response"].(map[string]any)["id"] != "resp_gw" {
		t.Fatalf("first %s %v", typ, d)
	}
	f.b.Write([]byte(created + delta))
	if typ, d := f.c.event(t); typ != "response.created" || d["sequence_number"] != 1.0 ||
		d["response"].(map[string]any)["id"] != "resp_gw" || d["response"].(map[string]any)["created_at"] != 7.0 {
		t.Fatalf("second %s %v", typ, d)
	}
	if typ, d := f.c.event(t); typ != "response.output_text.delta" || d["sequence_number"] != 2.0 {
		t.Fatalf("third %s %v", typ, d)
	}
	f.b.Write([]byte(completed))
	f.b.Finish(streams.Whole)
	if typ, d := f.c.event(t); typ != "response.completed" || d["sequence_number"] != 3.0 || d["response"].(map[string]any)["id"] != "resp_gw" {
		t.Fatalf("last %s %v", typ, d)
	}
	f.c.ended(t, f.done)
}

// A stream waiting for an attempt's next event writes an SSE comment every KeepAlive of its
// clock, and only then (docs/responses.md).
func TestFollowKeepsAliveEveryFifteenSecondsOfItsClock(t *testing.T) {
	f := followRunning(t)
	if typ, _ := f.c.event(t); typ != "response.queued" {
		t.Fatalf("first %s", typ)
	}
	blockUntil(t, f.clock, 1) // the keep-alive's ticker
	f.clock.Advance(KeepAlive - time.Millisecond)
	f.b.Write([]byte(delta))
	if typ, _ := f.c.event(t); typ != "response.output_text.delta" {
		t.Fatalf("before %s: %s", KeepAlive, typ)
	}
	for range 2 {
		f.clock.Advance(time.Millisecond)
		if got := f.c.next(t); got != ": keep-alive\n" {
			t.Fatalf("at %s: %q, want a comment", KeepAlive, got)
		}
		f.clock.Advance(KeepAlive - time.Millisecond)
	}
	f.b.Write([]byte(completed))
	f.b.Finish(streams.Whole)
	if typ, d := f.c.event(t); typ != "response.completed" || d["sequence_number"] != 2.0 {
		t.Fatalf("last %s %v", typ, d)
	}
	f.c.ended(t, f.done)
}

// A stream that begins while the response waits for a seat has its queued event at once and
// the attempt's events once it runs.
func TestFollowBeginsWhileQueued(t *testing.T) {
	op := running()
	op.Status = store.StatusQueued
	st := newMemStore(op)
	rd, clock := newReader(t, st)
	c, done := follow(t, rd, op, -1)
	if typ, _ := c.event(t); typ != "response.queued" {
		t.Fatalf("first %s", typ)
	}
	blockUntil(t, clock, 2) // the keep-alive, and the wait to look again
	ran := *op
	ran.Status, ran.Version = store.StatusRunning, op.Version+1
	st.set(ran)
	b := st.begin(op.ID)
	b.Write([]byte(delta + completed))
	b.Finish(streams.Whole)
	clock.Advance(lookAgain)
	if typ, d := c.event(t); typ != "response.output_text.delta" || d["sequence_number"] != 1.0 {
		t.Fatalf("second %s %v", typ, d)
	}
	if typ, _ := c.event(t); typ != "response.completed" {
		t.Fatalf("last %s", typ)
	}
	c.ended(t, done)
}

// An attempt that breaks off when the response was cancelled ends the stream with the
// cancelled object; one whose response goes on ends it with stream_attempt_lost, once the
// response has not settled within settleWait of the clock.
func TestFollowOfAnAttemptThatBrokeOff(t *testing.T) {
	t.Run("cancelled", func(t *testing.T) {
		f := followRunning(t)
		f.c.event(t)
		f.b.Write([]byte(delta))
		f.c.event(t)
		cancelled := *f.op
		cancelled.Status = store.StatusCanceled
		f.st.set(cancelled)
		f.b.Finish(streams.BrokeOff)
		if typ, d := f.c.event(t); typ != "response.cancelled" || d["sequence_number"] != 2.0 || d["response"].(map[string]any)["status"] != Cancelled {
			t.Fatalf("last %s %v", typ, d)
		}
		f.c.ended(t, f.done)
	})
	t.Run("lost", func(t *testing.T) {
		f := followRunning(t)
		f.c.event(t)
		f.b.Finish(streams.BrokeOff)
		for range settleWait/settlePoll + 1 { // till the f.clock is past settleWait
			blockUntil(t, f.clock, 2) // the keep-alive, and the next look
			f.clock.Advance(settlePoll)
		}
		if typ, d := f.c.event(t); typ != "error" || d["code"] != "stream_attempt_lost" || d["sequence_number"] != 1.0 {
			t.Fatalf("last %s %v", typ, d)
		}
		f.c.ended(t, f.done)
	})
}

// A whole answer without a terminal event ends with the final object once the response has
// settled, as a poll reads it.
func TestFollowOfAnAnswerWithoutATerminalEventEndsWithTheObject(t *testing.T) {
	f := followRunning(t)
	f.c.event(t)
	f.b.Write([]byte(delta))
	f.c.event(t)
	f.b.Finish(streams.Whole)
	blockUntil(t, f.clock, 2) // the keep-alive, and the next look
	failed := *f.op
	failed.Status, failed.Error = store.StatusFailed, &store.OperationError{Code: "UPSTREAM_TIMEOUT", Message: "too slow"}
	f.st.set(failed)
	f.clock.Advance(settlePoll)
	typ, d := f.c.event(t)
	o, _ := d["response"].(map[string]any)
	if typ != "response.failed" || d["sequence_number"] != 2.0 || o["error"].(map[string]any)["code"] != "UPSTREAM_TIMEOUT" {
		t.Fatalf("last %s %v", typ, d)
	}
	f.c.ended(t, f.done)
}

// A finished response replays its recorded answer from starting_after, and refuses a
// starting_after past its last event before it writes anything.
func TestFollowOfAFinishedResponseReplaysFromStartingAfter(t *testing.T) {
	op := running()
	op.Status = store.StatusSucceeded
	st := newMemStore(op)
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream")
	st.results[op.ID] = &store.Response{Status: http.StatusOK, Header: h, Body: []byte(created + delta + completed)}
	rd, _ := newReader(t, st)
	c, done := follow(t, rd, op, 1)
	if typ, d := c.event(t); typ != "response.output_text.delta" || d["sequence_number"] != 2.0 {
		t.Fatalf("after 1: %s %v", typ, d)
	}
	if typ, d := c.event(t); typ != "response.completed" || d["sequence_number"] != 3.0 {
		t.Fatalf("last %s %v", typ, d)
	}
	c.ended(t, done)
	var fe *FieldError
	if err := rd.Follow(&client{h: http.Header{}}, op, 4); !errors.As(err, &fe) || fe.Param != "starting_after" || !strings.Contains(fe.Message, "has 4 events") {
		t.Fatalf("starting_after 4 of 4 events: %v", err)
	}
}

// A finished response's object is read from its recorded answer once, then kept.
func TestObjectOfAFinishedResponseIsReadOnce(t *testing.T) {
	op := running()
	op.Status = store.StatusSucceeded
	st := newMemStore(op)
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream")
	st.results[op.ID] = &store.Response{Status: http.StatusOK, Header: h, Body: []byte(created + delta + completed)}
	rd, _ := newReader(t, st)
	for i := range 2 {
		o, err := rd.Object(op)
		if err != nil || o.Status() != Completed || o["id"] != "resp_gw" || fmt.Sprint(o["created_at"]) != "7" {
			t.Fatalf("poll %d: %v %v", i, o, err)
		}
		rd.Objects.Wait()
	}
	if st.loads != 1 {
		t.Fatalf("the answer was loaded %d times, want once", st.loads)
	}
}

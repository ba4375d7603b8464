// Package modelserver is a small, dependency-free mock of an OpenAI-compatible
// model server. It is the slow, flaky upstream that Mulligan's tests, README
// and demos put behind the gateway.
//
// The server answers POST /v1/chat/completions, POST /v1/completions and
// POST /v1/embeddings with deterministic, OpenAI-shaped JSON (or an SSE stream
// for "stream": true), and POST /v1/responses (the Responses API, whole or streamed with
// OpenAI's event types; background mode refused, as a server without a response store does),
// after a configurable latency that is cut short when the
// client goes away. Every model request gets a fresh execution number, sent as
// the X-Execution-Id response header and embedded in the response id
// ("chatcmpl-<n>", "cmpl-<n>", "embd-<n>", "resp_ms<n>"), so a test can tell a replayed
// response from a re-execution. GET /stats reports what the server actually
// executed; POST /stats/reset zeroes the counters.
//
// With Config.Slots the server behaves like an inference server (vLLM, TGI):
// at most Slots requests run at once and the rest wait inside the server in
// arrival order, blind to who sends them or how urgent they are. The stats
// then show the queue (Queued, MaxQueued, QueuedTime) and how busy the slots
// were (BusySlotTime, Utilisation), and each answer says in X-Queue-Wait how
// long it waited for its slot.
//
// A request's max_tokens (max_completion_tokens for chat) sets the length of its generation, as
// on a model that runs to its limit: the answer has exactly that many words, usage counts them
// and the finish reason is "length". With X-Mock-Latency in proportion, a bench gets calls of
// different lengths whose usage says how long they are, as a real model server's does.
//
// Per-request behaviour can be forced with the X-Mock-* request headers
// (see the Header* constants), and random failures can be injected with
// Config.FailRate.
//
// It is test infrastructure as much as an example: module/, test/e2e and bench/ count its
// executions to prove exactly-once, so a change here is a change to what those tests prove.
package modelserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Request and response header names understood or set by the server.
const (
	// HeaderExecutionID is the response header carrying the execution
	// sequence number of the request that produced the response.
	HeaderExecutionID = "X-Execution-Id"
	// HeaderIdempotencyKey is the request header whose value is counted in
	// Stats.ByKey.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderMockLatency overrides Config.Latency for one request. The value
	// is a Go duration ("250ms", "0s"); a bare integer means milliseconds.
	HeaderMockLatency = "X-Mock-Latency"
	// HeaderMockChunkDelay overrides Config.ChunkDelay for one streamed
	// request. Same syntax as HeaderMockLatency.
	HeaderMockChunkDelay = "X-Mock-Chunk-Delay"
	// HeaderMockStatus forces the response status (200-599) after the
	// latency. Statuses >= 400 answer an OpenAI-style JSON error body and
	// count as failed; lower statuses answer the normal body with that
	// status. It disables random failure injection for the request.
	HeaderMockStatus = "X-Mock-Status"
	// HeaderMockFail selects a transport-level failure. The only value is
	// "drop": after the latency the TCP connection is hijacked and closed
	// without writing a response.
	HeaderMockFail = "X-Mock-Fail"
	// HeaderMockBodyBytes pads the JSON response (or the first SSE chunk)
	// with a "padding" string field so the body is about N bytes long.
	HeaderMockBodyBytes = "X-Mock-Body-Bytes"
)

// DefaultModel is the model name echoed when a request does not name one.
const DefaultModel = "mulligan-demo"

// DefaultFailStatus is the status used for injected failures when
// Config.FailStatus is zero.
const DefaultFailStatus = http.StatusServiceUnavailable

// MaxRequestBytes is the largest request body the server accepts; larger
// bodies are answered with 413.
const MaxRequestBytes = 32 << 20

// MaxPadBytes caps the value of the X-Mock-Body-Bytes header.
const MaxPadBytes = 64 << 20

// Config configures a Server. The zero value answers immediately and never
// injects failures.
type Config struct {
	// Latency is how long every model request waits before answering
	// (the time to first byte). The wait ends early, and the request counts
	// as abandoned, if the client cancels or disconnects.
	Latency time.Duration
	// ChunkDelay is the pause after each SSE chunk of a streamed answer.
	ChunkDelay time.Duration
	// FailRate is the probability (0..1) that a model request without
	// X-Mock-Status / X-Mock-Fail answers FailStatus instead of a result.
	FailRate float64
	// FailStatus is the status of randomly injected failures
	// (DefaultFailStatus when zero).
	FailStatus int
	// Seed seeds the failure-injection random number generator; the same
	// seed gives the same sequence of rolls.
	Seed int64
	// Slots is how many model requests the server processes at once, like
	// an inference server's batch slots (vLLM's max_num_seqs, TGI's
	// max_concurrent_requests); the others wait inside the server, first
	// come first served, and their latency starts when they get a slot. A
	// streamed answer holds its slot until its last chunk. 0 (the default)
	// means no limit: every request starts at once.
	Slots int
}

// Server is the mock model server; it implements http.Handler. It is safe for
// concurrent use and holds no lock while a request waits.
type Server struct {
	cfg Config
	seq atomic.Int64 // execution sequence; never reset

	rngMu sync.Mutex
	rng   *rand.Rand

	mu        sync.Mutex // guards everything below
	epoch     uint64     // incremented by Reset
	inFlight  int64
	received  int64
	completed int64
	abandoned int64
	failed    int64
	byKey     map[string]int64
	byPath    map[string]int64
	slots     slotCounters // slots.go

	// onSeated, when set (by tests), is called under mu with the
	// execution id of each request that takes a slot, in that order; it
	// must not block.
	onSeated func(id int64)
}

// New returns a Server configured by cfg.
func New(cfg Config) *Server {
	if cfg.FailStatus == 0 {
		cfg.FailStatus = DefaultFailStatus
	}
	if cfg.FailRate < 0 {
		cfg.FailRate = 0
	}
	if cfg.FailRate > 1 {
		cfg.FailRate = 1
	}
	if cfg.Slots < 0 {
		cfg.Slots = 0
	}
	s := &Server{
		cfg:    cfg,
		rng:    rand.New(rand.NewPCG(uint64(cfg.Seed), 0x6d756c6c6967616e)),
		byKey:  map[string]int64{},
		byPath: map[string]int64{},
	}
	now := time.Now()
	s.slots.since, s.slots.lastTick = now, now
	return s
}

// ServeHTTP routes a request:
//
//	POST /v1/chat/completions, /v1/completions, /v1/embeddings  model requests
//	POST /v1/responses                                          (the Responses API)
//	GET  /stats                                                 counters (JSON)
//	POST /stats/reset                                           zero counters
//	GET  /metrics                                               vLLM-named gauges (Prometheus text)
//	GET  /healthz                                               200 "ok"
//
// A known path with the wrong method answers 405 (with Allow); an unknown
// path answers 404. Both use the OpenAI error JSON shape.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/chat/completions":
		s.serveModel(w, r, kindChat)
	case "/v1/completions":
		s.serveModel(w, r, kindCompletion)
	case "/v1/embeddings":
		s.serveModel(w, r, kindEmbedding)
	case "/v1/responses":
		s.serveModel(w, r, kindResponse)
	case "/stats":
		if !allow(w, r, http.MethodGet, http.MethodHead) {
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, s.Stats(), 0)
	case "/stats/reset":
		if !allow(w, r, http.MethodPost) {
			return
		}
		s.Reset()
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, s.Stats(), 0)
	case "/metrics":
		if !allow(w, r, http.MethodGet, http.MethodHead) {
			return
		}
		s.writeMetrics(w)
	case "/healthz":
		if !allow(w, r, http.MethodGet, http.MethodHead) {
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		io.WriteString(w, "ok")
	default:
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url",
			fmt.Sprintf("Unknown request URL: %s %s", r.Method, r.URL.Path), 0)
	}
}

// allow answers 405 and reports false unless r uses one of methods.
func allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
		fmt.Sprintf("Method %s not allowed for %s; use %s", r.Method, r.URL.Path, strings.Join(methods, " or ")), 0)
	return false
}

// controls are the per-request X-Mock-* settings.
type controls struct {
	latency    time.Duration
	chunkDelay time.Duration
	status     int // 0 = not forced
	drop       bool
	bodyBytes  int
}

func (s *Server) parseControls(h http.Header) (controls, error) {
	c := controls{latency: s.cfg.Latency, chunkDelay: s.cfg.ChunkDelay}
	var err error
	if v := h.Get(HeaderMockLatency); v != "" {
		if c.latency, err = parseDelay(v); err != nil {
			return c, fmt.Errorf("invalid %s header %q: %v", HeaderMockLatency, v, err)
		}
	}
	if v := h.Get(HeaderMockChunkDelay); v != "" {
		if c.chunkDelay, err = parseDelay(v); err != nil {
			return c, fmt.Errorf("invalid %s header %q: %v", HeaderMockChunkDelay, v, err)
		}
	}
	if v := h.Get(HeaderMockStatus); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 200 || n > 599 {
			return c, fmt.Errorf("invalid %s header %q: want a status 200-599", HeaderMockStatus, v)
		}
		c.status = n
	}
	if v := h.Get(HeaderMockFail); v != "" {
		if !strings.EqualFold(strings.TrimSpace(v), "drop") {
			return c, fmt.Errorf("invalid %s header %q: want \"drop\"", HeaderMockFail, v)
		}
		c.drop = true
	}
	if v := h.Get(HeaderMockBodyBytes); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > MaxPadBytes {
			return c, fmt.Errorf("invalid %s header %q: want 0-%d", HeaderMockBodyBytes, v, MaxPadBytes)
		}
		c.bodyBytes = n
	}
	return c, nil
}

func parseDelay(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, errors.New("negative delay")
		}
		return time.Duration(n) * time.Millisecond, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return 0, errors.New("negative delay")
	}
	return d, nil
}

// outcome is how a model request ended.
type outcome int

const (
	outcomeCompleted outcome = iota // full response written
	outcomeFailed                   // full injected-failure response written
	outcomeDropped                  // connection dropped on purpose
	outcomeAbandoned                // client went away
)

// execution tracks one model request for the counters.
type execution struct {
	s       *Server
	id      int64
	epoch   uint64
	seated  bool // holds a slot, given back by settle
	settled bool
	outcome outcome
}

func (s *Server) begin(path, key string) *execution {
	id := s.seq.Add(1)
	s.mu.Lock()
	s.inFlight++
	s.slots.maxInFlight = max(s.slots.maxInFlight, s.inFlight)
	s.received++
	s.byPath[path]++
	if key != "" {
		s.byKey[key]++
	}
	ep := s.epoch
	s.mu.Unlock()
	return &execution{s: s, id: id, epoch: ep}
}

// settle records the request's outcome; only the first call has an effect.
// It is called just before the final write so that a client that has read
// the response already sees it in the stats.
func (e *execution) settle(o outcome) {
	if e.settled {
		return
	}
	e.settled, e.outcome = true, o
	s := e.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	if e.seated {
		s.releaseSlotLocked(time.Now())
	}
	if e.epoch != s.epoch {
		return
	}
	switch o {
	case outcomeCompleted:
		s.completed++
	case outcomeFailed:
		s.completed++
		s.failed++
	case outcomeDropped:
		s.failed++
	case outcomeAbandoned:
		s.abandoned++
	}
}

// writeFailed moves a settled completed request to abandoned because its
// final write failed.
func (e *execution) writeFailed() {
	if !e.settled || (e.outcome != outcomeCompleted && e.outcome != outcomeFailed) {
		return
	}
	e.outcome = outcomeAbandoned
	s := e.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.epoch == s.epoch {
		s.completed--
		s.abandoned++
	}
}

func (s *Server) rollFailure() bool {
	switch {
	case s.cfg.FailRate <= 0:
		return false
	case s.cfg.FailRate >= 1:
		return true
	}
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Float64() < s.cfg.FailRate
}

func (s *Server) serveModel(w http.ResponseWriter, r *http.Request, kind kind) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	e := s.begin(r.URL.Path, r.Header.Get(HeaderIdempotencyKey))
	defer e.settle(outcomeAbandoned) // no-op unless nothing else settled it
	w.Header().Set(HeaderExecutionID, strconv.FormatInt(e.id, 10))

	// Validation errors answer at once, without the latency.
	ctl, err := s.parseControls(r.Header)
	if err != nil {
		e.settle(outcomeCompleted)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_mock_header", err.Error(), 0)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			e.settle(outcomeCompleted)
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
				fmt.Sprintf("request body larger than %d bytes", MaxRequestBytes), 0)
		}
		return // otherwise the client went away while sending: abandoned
	}
	req, err := parseRequest(kind, body)
	if err != nil {
		e.settle(outcomeCompleted)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", err.Error(), ctl.bodyBytes)
		return
	}
	if req.background {
		// A server without a response store cannot keep a response to be retrieved later.
		e.settle(outcomeCompleted)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "background_unsupported",
			"Background mode needs a response store, and this server has none; send the request without background.", 0)
		return
	}

	waited, ok := s.takeSlot(r.Context(), e)
	if !ok {
		return // abandoned while queued
	}
	w.Header().Set(HeaderQueueWait, waited.String())
	if !wait(r.Context(), ctl.latency) {
		return // abandoned
	}

	status := http.StatusOK
	switch {
	case ctl.drop:
		e.settle(outcomeDropped)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(http.ErrAbortHandler) // e.g. HTTP/2: reset the stream instead
		}
		conn.Close()
		return
	case ctl.status >= 400:
		e.settle(outcomeFailed)
		if err := injectedError(w, ctl.status, ctl.bodyBytes); err != nil {
			e.writeFailed()
		}
		return
	case ctl.status != 0:
		status = ctl.status
	case s.rollFailure():
		e.settle(outcomeFailed)
		if err := injectedError(w, s.cfg.FailStatus, ctl.bodyBytes); err != nil {
			e.writeFailed()
		}
		return
	}

	created := time.Now().Unix()
	if req.kind == kindResponse && req.stream {
		s.streamEvents(w, r.Context(), e, status, req.responseEvents(e.id, created), ctl)
		return
	}
	if req.kind == kindResponse {
		b := pad(mustMarshal(req.responseOf(e.id, created, true)), ctl.bodyBytes)
		e.settle(outcomeCompleted)
		if err := writeBody(w, status, "application/json", b); err != nil {
			e.writeFailed()
		}
		return
	}
	if req.stream {
		s.stream(w, r.Context(), e, status, req.chunks(e.id, created), ctl)
		return
	}
	b := pad(mustMarshal(req.response(e.id, created)), ctl.bodyBytes)
	e.settle(outcomeCompleted)
	if err := writeBody(w, status, "application/json", b); err != nil {
		e.writeFailed()
	}
}

// stream writes chunks as server-sent events, flushing after each and then
// waiting ChunkDelay, and ends with "data: [DONE]".
func (s *Server) stream(w http.ResponseWriter, ctx context.Context, e *execution, status int, chunks []any, ctl controls) {
	rc := beginEventStream(w, status)
	for i, c := range chunks {
		b := mustMarshal(c)
		if i == 0 {
			b = pad(b, ctl.bodyBytes)
		}
		if !writeEvent(w, rc, b) || !wait(ctx, ctl.chunkDelay) {
			return // abandoned
		}
	}
	e.settle(outcomeCompleted)
	if !writeEvent(w, rc, []byte("[DONE]")) {
		e.writeFailed()
	}
}

// streamEvents writes a streamed response's named events as server-sent events, flushing
// after each and then waiting ChunkDelay; the Responses API ends with its last event, without
// "[DONE]".
func (s *Server) streamEvents(w http.ResponseWriter, ctx context.Context, e *execution, status int, events []responseEvent, ctl controls) {
	rc := beginEventStream(w, status)
	for i, ev := range events {
		if i == len(events)-1 {
			e.settle(outcomeCompleted)
		}
		if !writeNamedEvent(w, rc, ev.name, mustMarshal(ev.data)) {
			e.writeFailed()
			return // abandoned
		}
		if i < len(events)-1 && !wait(ctx, ctl.chunkDelay) {
			return // abandoned
		}
	}
}

// beginEventStream writes the head of a server-sent events answer with status, and returns
// the controller that flushes each event.
func beginEventStream(w http.ResponseWriter, status int) *http.ResponseController {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(status)
	return http.NewResponseController(w)
}

func writeEvent(w http.ResponseWriter, rc *http.ResponseController, data []byte) bool {
	return writeNamedEvent(w, rc, "", data)
}

// writeNamedEvent writes one event, with an "event:" line when name is set, and flushes.
func writeNamedEvent(w http.ResponseWriter, rc *http.ResponseController, name string, data []byte) bool {
	buf := make([]byte, 0, len(data)+len(name)+16)
	if name != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, name...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := w.Write(buf); err != nil {
		return false
	}
	if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	return true
}

// wait sleeps for d and reports whether ctx is still live afterwards.
func wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// apiError is the OpenAI error envelope.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func injectedError(w http.ResponseWriter, status, padTo int) error {
	typ := "server_error"
	switch {
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case status < 500:
		typ = "invalid_request_error"
	}
	return writeError(w, status, typ, "mock_injected_failure",
		fmt.Sprintf("mulligan model-server: injected failure (status %d %s)", status, http.StatusText(status)), padTo)
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string, padTo int) error {
	var c *string
	if code != "" {
		c = &code
	}
	return writeJSON(w, status, apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: c}}, padTo)
}

func writeJSON(w http.ResponseWriter, status int, v any, padTo int) error {
	return writeBody(w, status, "application/json", pad(mustMarshal(v), padTo))
}

// writeBody writes b plus a trailing newline with an exact Content-Length.
func writeBody(w http.ResponseWriter, status int, contentType string, b []byte) error {
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, err := w.Write(b)
	return err
}

func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own, always-encodable types are marshalled
	}
	return b
}

// pad grows the JSON object b with a "padding" field so that b plus the
// trailing newline written by writeBody is n bytes long. It leaves b alone
// when n is too small.
func pad(b []byte, n int) []byte {
	const field = `,"padding":""`
	extra := n - 1 - len(b) - len(field)
	if extra < 0 || len(b) < 2 || b[len(b)-1] != '}' {
		return b
	}
	out := make([]byte, 0, n)
	out = append(out, b[:len(b)-1]...)
	out = append(out, `,"padding":"`...)
	out = append(out, strings.Repeat("x", extra)...)
	out = append(out, `"}`...)
	return out
}

// Package capture holds the writers that record an upstream's answer for replay (a Tee that
// also gets it to the client, a Buffer that keeps it in memory) and the writer of a recorded
// answer (docs/api.md, Replays). What is recorded is the answer without the headers of one
// connection or of the gateway itself.
package capture

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/store"
)

// The gateway's own per-response headers on a keyed answer (docs/api.md); never recorded.
const (
	HeaderExpires  = "Idempotency-Expires"
	HeaderReplayed = "Idempotent-Replayed"
)

// ErrTooLarge is what a Buffer's Write returns past its limit: the proxy stops reading.
var ErrTooLarge = errors.New("the upstream response is over max_result")

// Sink takes over an event-stream answer as it arrives (docs/streams.md): Open reports whether
// it does for an answer with status and header, and Write then gets every byte of the body.
type Sink interface {
	Open(status int, header http.Header) bool
	Write(p []byte)
}

// Recorded is an answer as a writer recorded it.
type Recorded struct {
	Status int // 0: no answer was written
	Header http.Header
	Body   []byte
	Over   bool // the answer passed the limit and its body was dropped
}

// Tee records an upstream response for replay, up to a limit, and gets it to the client.
// A streamed response (SSE, NDJSON) goes out as it arrives, flushed when the upstream flushes.
// Any other response is held until Release, so the caller can make the record durable first:
// under durability sync no client has an answer that a crash could take from its retry. A held
// response that passes the limit cannot be replayed anyway and goes out at once.
//
// When the client goes away the upstream call goes on: writes to the client are dropped and
// recording continues, so a retry can replay what the first attempt paid for.
type Tee struct {
	client     http.ResponseWriter
	clientGone bool
	// Trailers are declared on a streamed response, whose headers leave before it is known
	// whether the answer will be recorded; the caller sets them once it is.
	Trailers []string
	// Streams, when set, may take over an event-stream answer (docs/streams.md).
	Streams   Sink
	streaming bool
	// Ready, when set, is called once, before the first byte of the answer (its status line
	// included) goes to the client; it reports whether the answer may go. When it may not,
	// Ready answered the client itself, and the rest is recorded but not sent.
	Ready func(client http.ResponseWriter) bool

	status  int
	header  http.Header // snapshot of the recorded headers
	body    bytes.Buffer
	limit   int64
	overran bool
	holding bool // the response waits for release
}

// NewTee records what is written to client, up to limit bytes of body.
func NewTee(client http.ResponseWriter, limit int64) *Tee {
	return &Tee{client: client, limit: limit}
}

// Client is the client's writer.
func (t *Tee) Client() http.ResponseWriter { return t.client }

// Streaming reports whether Streams took the answer over.
func (t *Tee) Streaming() bool { return t.streaming }

// Written reports whether a (final) status was written.
func (t *Tee) Written() bool { return t.status != 0 }

// Recorded is the answer as recorded so far.
func (t *Tee) Recorded() Recorded {
	return Recorded{Status: t.status, Header: t.header, Body: t.body.Bytes(), Over: t.overran}
}

func (t *Tee) Header() http.Header { return t.client.Header() }

func (t *Tee) WriteHeader(status int) {
	if t.status != 0 {
		return
	}
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		if t.WaitReady() {
			t.client.WriteHeader(status) // informational: passed on, not recorded
		}
		return
	}
	t.status = status
	t.header = RecordableHeader(t.client.Header())
	t.holding = !IsStreamed(t.header.Get("Content-Type"))
	t.streaming = t.Streams != nil && t.Streams.Open(status, t.header)
	if !t.holding && t.WaitReady() {
		for _, name := range t.Trailers {
			t.client.Header().Add("Trailer", name)
		}
		t.client.WriteHeader(status)
	}
}

// WaitReady calls Ready once, and reports whether the client may have the answer: false when
// Ready answered it instead, or it went away.
func (t *Tee) WaitReady() bool {
	if ready := t.Ready; ready != nil {
		t.Ready = nil
		if !ready(t.client) {
			t.clientGone = true
		}
	}
	return !t.clientGone
}

func (t *Tee) Write(p []byte) (int, error) {
	if t.status == 0 {
		t.WriteHeader(http.StatusOK)
	}
	if t.streaming {
		t.Streams.Write(p)
		return len(p), nil
	}
	if t.overran {
		t.ToClient(p)
		return len(p), nil
	}
	t.body.Write(p)
	if int64(t.body.Len()) > t.limit {
		t.overran = true
		t.Release() // too large to replay: stop holding, send what came so far
		t.body = bytes.Buffer{}
		return len(p), nil
	}
	if !t.holding {
		t.ToClient(p)
	}
	return len(p), nil
}

// Release sends a held response to the client; for a streamed one it does nothing.
func (t *Tee) Release() {
	if !t.holding {
		return
	}
	t.holding = false
	if t.WaitReady() {
		t.client.WriteHeader(t.status)
		t.ToClient(t.body.Bytes())
	}
}

// ToClient writes p to the client unless it went away.
func (t *Tee) ToClient(p []byte) {
	if !t.WaitReady() {
		return
	}
	if _, err := t.client.Write(p); err != nil {
		t.clientGone = true
	}
}

// Flush passes the upstream's flushes on, so streamed responses reach the client as they come.
func (t *Tee) Flush() {
	if t.status == 0 {
		t.WriteHeader(http.StatusOK)
	}
	if t.holding || t.streaming {
		return // a recorded stream is flushed event by event
	}
	t.FlushClient()
}

// FlushClient flushes the client's writer unless it went away.
func (t *Tee) FlushClient() {
	if !t.WaitReady() {
		return
	}
	if err := http.NewResponseController(t.client).Flush(); err != nil {
		t.clientGone = true
	}
}

// streamedTypes are media types of responses that go out as they arrive instead of after their
// record is durable: token streams of model servers.
var streamedTypes = map[string]bool{
	"text/event-stream": true, "application/x-ndjson": true, "application/jsonl": true,
	"application/json-seq": true, "application/stream+json": true,
}

// IsStreamed reports whether an answer of contentType goes out as it arrives.
func IsStreamed(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return streamedTypes[strings.ToLower(strings.TrimSpace(mt))]
}

// hopByHop headers describe one connection and are never replayed (RFC 9110 §7.6.1), nor are
// the gateway's own per-response headers.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	apierr.HeaderRequestID: true, HeaderExpires: true, HeaderReplayed: true,
}

// RecordableHeader is a copy of h without the headers that are never recorded.
func RecordableHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if hopByHop[k] || strings.HasPrefix(k, "Trailer:") {
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}

// Buffer records a whole response in memory, up to a limit; past it the response is
// marked over and writes fail, which makes the proxy stop reading from the upstream.
type Buffer struct {
	header http.Header
	status int
	body   bytes.Buffer
	limit  int64
	over   bool
	// Stream, when set, publishes an event-stream answer as it arrives (docs/streams.md).
	Stream    Sink
	streaming bool
}

// NewBuffer records up to limit bytes of body.
func NewBuffer(limit int64) *Buffer {
	return &Buffer{header: http.Header{}, limit: limit}
}

func (b *Buffer) Header() http.Header { return b.header }

func (b *Buffer) WriteHeader(status int) {
	if b.status == 0 && (status < 100 || status >= 200) {
		b.status = status
		b.streaming = b.Stream != nil && b.Stream.Open(status, RecordableHeader(b.header))
	}
}

func (b *Buffer) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.WriteHeader(http.StatusOK)
	}
	if b.over {
		return 0, ErrTooLarge
	}
	if int64(b.body.Len()+len(p)) > b.limit {
		b.over, b.body = true, bytes.Buffer{}
		return 0, ErrTooLarge
	}
	if b.streaming {
		b.Stream.Write(p)
	}
	return b.body.Write(p)
}

// Flush is a no-op: the response is kept, not streamed.
func (b *Buffer) Flush() {}

// Result is the answer as recorded.
func (b *Buffer) Result() Recorded {
	return Recorded{Status: b.status, Header: RecordableHeader(b.header), Body: b.body.Bytes(), Over: b.over}
}

// Replay writes a recorded response byte for byte, marked as a replay.
func Replay(w http.ResponseWriter, rec *store.Record) {
	h := w.Header()
	h.Set(HeaderReplayed, "true")
	h.Set(HeaderExpires, rec.ExpiresAt.UTC().Format(http.TimeFormat))
	WriteResponse(w, *rec.Response)
}

// SetRecordedHeader sets a recorded (or buffered) upstream answer's header on h, the client's,
// so that it goes out as the live answer went: Caddy presets `Server: Caddy` on every response,
// and reverse_proxy deletes it when it relays an upstream's answer (it adds Via instead), so a
// relayed answer has a Server header only when the upstream sent one. A replay, a result and
// an answer buffered for the client go out the same way: Server only when it was recorded.
func SetRecordedHeader(h, recorded http.Header) {
	if _, ok := recorded["Server"]; !ok {
		h.Del("Server")
	}
	for k, v := range recorded {
		h[k] = v
	}
}

// WriteResponse writes a recorded response whole, over the headers already set (the gateway's
// own, which recorded ones never carry).
func WriteResponse(w http.ResponseWriter, resp store.Response) {
	h := w.Header()
	SetRecordedHeader(h, resp.Header)
	h.Del("Transfer-Encoding")
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

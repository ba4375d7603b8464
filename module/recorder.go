package module

import (
	"bytes"
	"net/http"
	"strings"
)

// teeWriter records an upstream response for replay, up to a limit, and gets it to the client.
// A streamed response (SSE, NDJSON) goes out as it arrives, flushed when the upstream flushes.
// Any other response is held until release, so the caller can make the record durable first:
// under durability sync no client has an answer that a crash could take from its retry. A held
// response that passes the limit cannot be replayed anyway and goes out at once.
//
// When the client goes away the upstream call goes on: writes to the client are dropped and
// recording continues, so a retry can replay what the first attempt paid for.
type teeWriter struct {
	client     http.ResponseWriter
	clientGone bool
	// trailers are declared on a streamed response, whose headers leave before it is known
	// whether the answer will be recorded; the caller sets them once it is.
	trailers []string
	// streams, when set, may take over an event-stream answer (docs/streams.md); streaming
	// says it did.
	streams   *streamRecording
	streaming bool

	status  int
	header  http.Header // snapshot of the recorded headers
	body    bytes.Buffer
	limit   int64
	overran bool
	holding bool // the response waits for release
	sent    int  // bytes of body already sent to the client
}

func newTeeWriter(client http.ResponseWriter, limit int64) *teeWriter {
	return &teeWriter{client: client, limit: limit}
}

func (t *teeWriter) Header() http.Header { return t.client.Header() }

func (t *teeWriter) WriteHeader(status int) {
	if t.status != 0 {
		return
	}
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		t.client.WriteHeader(status) // informational: passed on, not recorded
		return
	}
	t.status = status
	t.header = recordableHeader(t.client.Header())
	t.holding = !isStreamed(t.header.Get("Content-Type"))
	t.streaming = t.streams != nil && t.streams.open(status, t.header)
	if !t.holding {
		for _, name := range t.trailers {
			t.client.Header().Add("Trailer", name)
		}
		t.client.WriteHeader(status)
	}
}

func (t *teeWriter) Write(p []byte) (int, error) {
	if t.status == 0 {
		t.WriteHeader(http.StatusOK)
	}
	if t.streaming {
		t.streams.write(p)
		return len(p), nil
	}
	if t.overran {
		t.toClient(p)
		return len(p), nil
	}
	t.body.Write(p)
	if int64(t.body.Len()) > t.limit {
		t.overran = true
		t.release() // too large to replay: stop holding, send what came so far
		t.body = bytes.Buffer{}
		return len(p), nil
	}
	if !t.holding {
		t.toClient(p)
	}
	return len(p), nil
}

// release sends a held response to the client; for a streamed one it does nothing.
func (t *teeWriter) release() {
	if !t.holding {
		return
	}
	t.holding = false
	t.client.WriteHeader(t.status)
	t.toClient(t.body.Bytes())
}

func (t *teeWriter) toClient(p []byte) {
	if t.clientGone {
		return
	}
	if _, err := t.client.Write(p); err != nil {
		t.clientGone = true
	}
}

// Flush passes the upstream's flushes on, so streamed responses reach the client as they come.
func (t *teeWriter) Flush() {
	if t.status == 0 {
		t.WriteHeader(http.StatusOK)
	}
	if t.holding || t.streaming {
		return // a recorded stream is flushed event by event
	}
	t.flushClient()
}

func (t *teeWriter) flushClient() {
	if t.clientGone {
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

func isStreamed(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return streamedTypes[strings.ToLower(strings.TrimSpace(mt))]
}

// hopByHop headers describe one connection and are never replayed (RFC 9110 §7.6.1), nor are
// the gateway's own per-response headers.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	headerRequestID: true, headerExpires: true, headerReplayed: true,
}

func recordableHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if hopByHop[k] || strings.HasPrefix(k, "Trailer:") {
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}

// bufferWriter records a whole response in memory, up to a limit; past it the response is
// marked over and writes fail, which makes the proxy stop reading from the upstream.
type bufferWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
	limit  int64
	over   bool
	// stream, when set, publishes an event-stream answer as it arrives (docs/streams.md).
	stream    *opStream
	streaming bool
}

func newBufferWriter(limit int64) *bufferWriter {
	return &bufferWriter{header: http.Header{}, limit: limit}
}

func (b *bufferWriter) Header() http.Header { return b.header }

func (b *bufferWriter) WriteHeader(status int) {
	if b.status == 0 && (status < 100 || status >= 200) {
		b.status = status
		b.streaming = b.stream != nil && b.stream.begin(status, recordableHeader(b.header))
	}
}

func (b *bufferWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.WriteHeader(http.StatusOK)
	}
	if b.over {
		return 0, errResultTooLarge
	}
	if int64(b.body.Len()+len(p)) > b.limit {
		b.over, b.body = true, bytes.Buffer{}
		return 0, errResultTooLarge
	}
	if b.streaming {
		b.stream.write(p)
	}
	return b.body.Write(p)
}

// Flush is a no-op: the response is kept, not streamed.
func (b *bufferWriter) Flush() {}

func (b *bufferWriter) result() attemptResult {
	return attemptResult{status: b.status, header: recordableHeader(b.header), body: b.body.Bytes(), over: b.over}
}

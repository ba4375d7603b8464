// Package sse frames Server-Sent Events (the WHATWG HTML "event stream" grammar): it cuts an
// upstream's byte stream into events, gives every relayed event an id a client can resume from
// with Last-Event-ID, and recognises an event stream by its media type (docs/streams.md). It
// needs only the standard library.
package sse

import (
	"bytes"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// Splitter cuts a Server-Sent Events byte stream into events: blocks of lines ended by a
// blank line, with CRLF, LF or CR line ends (the SSE spec's "event stream" grammar). It holds at
// most one partial event, and nothing more: a push is scanned where it lies, and only the
// partial event it leaves is copied, so a stream that goes quiet after a large read (a proxy
// reads up to 32 KiB at once) keeps no buffer of that read's size (docs/streams.md).
type Splitter struct {
	buf       []byte // the partial event
	pos       int    // where scanning resumes
	lineStart int    // start of the line being scanned
}

// keptBuffer is the largest partial-event buffer a splitter keeps for reuse once the event in
// it completed: a larger one (an event of its size is rare) is let go.
const keptBuffer = 4 << 10

// Push adds p and calls emit with each event it completes. The slice given to emit is only
// valid during the call. The partial event left over is moved to the front once per push, not
// once per event, so a large chunk of many events costs one pass.
func (s *Splitter) Push(p []byte, emit func(block []byte)) {
	data := p // with no partial event held, p is scanned in place
	if len(s.buf) > 0 {
		s.buf = append(s.buf, p...)
		data = s.buf
	}
	start := 0
	for s.pos < len(data) {
		c := data[s.pos]
		if c != '\n' && c != '\r' {
			s.pos++
			continue
		}
		end := s.pos + 1
		if c == '\r' {
			if end == len(data) {
				break // a CR at the end: wait to see whether an LF follows
			}
			if data[end] == '\n' {
				end++
			}
		}
		blank := s.pos == s.lineStart
		s.pos, s.lineStart = end, end
		if !blank {
			continue
		}
		if block := data[start:end]; len(block) > len(lineEnd(block)) { // a stray blank line carries nothing
			emit(block)
		}
		start = end
	}
	if start == len(data) && cap(s.buf) > keptBuffer {
		s.buf = nil
	}
	s.buf = append(s.buf[:0], data[start:]...) // within buf, copy overlaps forward: safe
	s.pos -= start
	s.lineStart -= start
}

// Buffered is the size of the partial event held.
func (s *Splitter) Buffered() int { return len(s.buf) }

// Rest returns the partial event held (an upstream that ended without a closing blank line)
// and forgets it.
func (s *Splitter) Rest() []byte {
	out := s.buf
	s.buf, s.pos, s.lineStart = nil, 0, 0
	return out
}

// Partial is the partial event held, which the splitter keeps: valid until the next Push.
func (s *Splitter) Partial() []byte { return s.buf }

// lineEnd is the line terminator at the end of b.
func lineEnd(b []byte) []byte {
	switch {
	case bytes.HasSuffix(b, []byte("\r\n")):
		return b[len(b)-2:]
	case len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r'):
		return b[len(b)-1:]
	}
	return nil
}

// WithEventID returns a copy of the event block with an id, and that id: the upstream's own
// when the block has an id field, else seq, so that every relayed event can be resumed from
// with Last-Event-ID.
func WithEventID(block []byte, seq uint64) ([]byte, string) {
	if id, ok := eventID(block); ok {
		return bytes.Clone(block), id
	}
	id := strconv.FormatUint(seq, 10)
	out := make([]byte, 0, len(block)+len(id)+5)
	out = append(append(append(out, "id: "...), id...), '\n')
	return append(out, block...), id
}

// eventID finds the block's id field ("id: value", or "id" alone for an empty id). As a
// browser reads the stream, the block's last id line counts, and one whose value holds a NUL is
// ignored (the HTML standard's event stream interpretation).
func eventID(block []byte) (id string, found bool) {
	for len(block) > 0 {
		i := bytes.IndexAny(block, "\r\n")
		line := block
		if i >= 0 {
			line, block = block[:i], block[i+1:]
		} else {
			block = nil
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		if string(name) == "id" && bytes.IndexByte(value, 0) < 0 {
			id, found = string(bytes.TrimPrefix(value, []byte(" "))), true
		}
	}
	return id, found
}

// IsEventStream reports whether a response is Server-Sent Events, the kind of stream that is
// recorded event by event and can be joined and resumed (docs/streams.md).
func IsEventStream(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "text/event-stream"
}

// WantsEventStream reports whether the client asked for Server-Sent Events.
func WantsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == "text/event-stream" {
				return true
			}
		}
	}
	return false
}

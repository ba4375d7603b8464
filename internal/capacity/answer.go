package capacity

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"
)

// AnswerWriter passes a call's answer on and notes what the adaptive limit reads of it (its
// status, whether it streams, the time to its first byte, its usage's completion_tokens: docs/
// capacity.md, "limit auto"); Unwrap keeps flushing and the rest of http.ResponseController
// working through it. Once Cut is canceled because the call's shared seat lapsed, a route that
// had not answered yet passes nothing on (the proxy's 499 for a canceled call): the gateway
// answers instead.
type AnswerWriter struct {
	http.ResponseWriter
	Status int
	Cut    context.Context
	Now    func() time.Time

	firstByte time.Time
	stream    bool
	tokens    TokenScanner
}

// Sample is how the call that started at start went, for the adaptive limit.
func (w *AnswerWriter) Sample(start time.Time, ctxErr error) Sample {
	out := Sample{Status: w.Status, Overloaded: Overloaded(w.Status, ctxErr), Stream: w.stream, Tokens: w.tokens.Tokens()}
	if !w.firstByte.IsZero() {
		out.FirstByte = w.firstByte.Sub(start)
	}
	return out
}

// SeatLapsed reports whether ctx was cut because its call's shared seat lapsed.
func SeatLapsed(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ErrSeatLapsed) }

// dropped reports whether a first write comes after the cut, and is not passed on.
func (w *AnswerWriter) dropped() bool {
	return w.Status == 0 && w.Cut != nil && SeatLapsed(w.Cut)
}

func (w *AnswerWriter) WriteHeader(code int) {
	if w.dropped() {
		return
	}
	if w.Status == 0 && code >= 200 {
		w.Status = code
		w.stream = StreamedAnswer(w.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *AnswerWriter) Write(b []byte) (int, error) {
	if w.dropped() {
		return 0, context.Cause(w.Cut)
	}
	if w.Status == 0 {
		w.Status = http.StatusOK
		w.stream = StreamedAnswer(w.Header())
	}
	if w.firstByte.IsZero() && len(b) > 0 && w.Now != nil {
		w.firstByte = w.Now()
	}
	if w.Status >= 200 && w.Status < 300 {
		_, _ = w.tokens.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

func (w *AnswerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Ticket carries a seat taken before a call starts (a call in `after` mode) to the handler
// that sends it.
type Ticket struct {
	mu sync.Mutex
	s  *Seat
}

type ticketKey struct{}

// WithTicket returns ctx carrying a ticket for s.
func WithTicket(ctx context.Context, s *Seat) (context.Context, *Ticket) {
	t := &Ticket{s: s}
	return context.WithValue(ctx, ticketKey{}, t), t
}

// TicketOf is the ticket ctx carries; nil when none.
func TicketOf(ctx context.Context) *Ticket {
	t, _ := ctx.Value(ticketKey{}).(*Ticket)
	return t
}

// Take hands over the seat, once; nil when there is none.
func (t *Ticket) Take() *Seat {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.s
	t.s = nil
	return s
}

// Drop gives the seat back if no call took it.
func (t *Ticket) Drop() {
	if s := t.Take(); s != nil {
		s.GiveBack() // no call: nothing for the limit, or the key's turn, to learn
	}
}

// IsJSON reports whether a body of size bytes with Content-Type contentType goes upstream as
// JSON. A model server's own check (vLLM's, FastAPI's) reads the media type before any ';', so
// this does too, and never fails on a parameter it cannot parse; a body with no Content-Type
// counts as JSON too, so that no body a server might read as JSON carries the client's own
// priority.
func IsJSON(contentType string, size int64) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	if mt == "" {
		return size != 0
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

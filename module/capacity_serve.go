package module

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capacity"
)

// headerMaxQueueWait is the request header asking for a shorter queue deadline than
// max_queue_wait, in seconds (docs/capacity.md).
const headerMaxQueueWait = "Max-Queue-Wait"

// outcomeSaturated counts sync calls refused 503 UPSTREAM_SATURATED.
const outcomeSaturated = "saturated"

// provisionCapacity joins the process-wide seats of the block's upstream (docs/capacity.md).
func (h *Handler) provisionCapacity(set storageSpec) error {
	if h.Capacity == nil {
		return nil
	}
	if h.Capacity.Shared > 0 && set.backend != BackendPostgres {
		return fmt.Errorf("capacity: shared bounds the replicas on one PostgreSQL storage; with %s storage one process owns it and limit is the bound", set.backend)
	}
	where := set.where()
	key := seatPoolKey(where, h.conv.prefix)
	v, _, err := seatPools.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newSeatPool(key, where, set.name()+h.conv.prefix, h.conv.prefix, *h.Capacity), nil
	})
	if err != nil {
		return err
	}
	h.seats, h.seatKey = v.(*seatPool), key
	h.seats.configure(*h.Capacity)
	h.conv.capacity = h.Capacity
	return nil
}

// Cleanup lets go of the block's seats; calls still holding one keep it until they end.
func (h *Handler) Cleanup() error {
	if h.seats != nil {
		_, _ = seatPools.Delete(h.seatKey)
	}
	return nil
}

// syncSeatWait is how long a sync call waits for a seat: capacity.wait, or a shorter
// Prefer: wait=N.
func (h *Handler) syncSeatWait(r *http.Request) time.Duration {
	wait := time.Duration(h.Capacity.Wait)
	if p := parsePrefer(r.Header.Values("Prefer")); p.hasWait && p.wait < wait {
		wait = p.wait
	}
	return max(wait, time.Millisecond) // wait=0: take a free seat, never wait for one
}

// liveAsk is a live request's place in the order (capacity_fair.go).
func (h *Handler) liveAsk(r *http.Request, scope string, now time.Time) seatAsk {
	return h.Capacity.ask(r, scope, now)
}

// seated wraps the rest of the route: each call it sends upstream holds a seat while it runs.
// A call that finds none within its wait is answered 503 UPSTREAM_SATURATED and never reaches
// the upstream.
func (h *Handler) seated(next caddyhttp.Handler, scope string) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		ask := h.liveAsk(r, scope, h.now())
		r, release, ok := h.passPriorityLive(w, r, ask)
		if !ok {
			return nil
		}
		defer release()
		s := ticketOf(r.Context()).take()
		if s == nil {
			var err error
			if s, err = h.seats.Acquire(r.Context(), ask, h.syncSeatWait(r)); err != nil {
				h.saturated(w, r, err)
				return nil
			}
		}
		ctx, stop := s.Watch(r.Context())
		sw := &statusWriter{ResponseWriter: w, cut: ctx, now: h.now}
		defer func() { s.Release(sw.sample(s.Start(), r.Context().Err())) }()
		err := next.ServeHTTP(sw, r.WithContext(ctx))
		stop()
		if sw.status == 0 && seatLapsed(ctx) {
			// Cut before it answered: the shared seats fail closed, as when one cannot be taken.
			w.Header().Set(headerRequestID, r.Header.Get(headerRequestID))
			h.storageFailed(w, context.Cause(ctx))
			return nil
		}
		return err
	})
}

// seatLapsed reports whether ctx was cut because its call's shared seat lapsed.
func seatLapsed(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errSeatLapsed) }

// saturated answers a sync call that found no seat: 503 UPSTREAM_SATURATED when none came
// free in time, 503 STORAGE_UNAVAILABLE when the shared seats could not be counted (fail
// closed, docs/capacity.md). A 503 is never recorded for the key, so a retry runs the call.
func (h *Handler) saturated(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client left while waiting: nobody to answer
	}
	w.Header().Set(headerRequestID, r.Header.Get(headerRequestID))
	if !errors.Is(err, errNoSeat) {
		h.storageFailed(w, err)
		return
	}
	countRequest(outcomeSaturated)
	h.seats.countRefusal()
	snap := h.seats.Snapshot()
	apierr.Write(w, apierr.Error{Code: apierr.CodeUpstreamSaturated, RetryAfter: h.seats.RetryAfter(),
		Details: map[string]any{"limit": snap.Limit, "in_use": snap.InUse},
		Message: "Every upstream seat stayed busy for as long as this call may wait; retry after the time given."})
}

// reserveSeat takes a seat for a call in `after` mode, waiting no longer than its window or
// capacity.wait: false when none came free, and the call is queued instead, or when its client
// left while it waited (docs/capacity.md).
func (h *Handler) reserveSeat(kr *keyedRequest, window time.Duration) (*seatTicket, bool) {
	wait := max(min(h.syncSeatWait(kr.r), window), time.Millisecond)
	s, err := h.seats.Acquire(kr.r.Context(), h.liveAsk(kr.r, kr.scope, h.now()), wait)
	if err != nil {
		return nil, false // not a refusal: the call is queued, unless its client left
	}
	t := &seatTicket{s: s}
	kr.r = kr.r.WithContext(context.WithValue(kr.r.Context(), seatTicketKey{}, t))
	return t, true
}

// seatTicket carries a seat taken before the call starts to the handler that sends it.
type seatTicket struct {
	mu sync.Mutex
	s  *seat
}

type seatTicketKey struct{}

func ticketOf(ctx context.Context) *seatTicket {
	t, _ := ctx.Value(seatTicketKey{}).(*seatTicket)
	return t
}

// take hands over the seat, once; nil when there is none.
func (t *seatTicket) take() *seat {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.s
	t.s = nil
	return s
}

// drop gives the seat back if no call took it.
func (t *seatTicket) drop() {
	if s := t.take(); s != nil {
		s.Release(capacity.Sample{}) // no call: nothing for the limit to learn
	}
}

// queueDeadline is when an operation submitted now by r stops being worth running:
// max_queue_wait, or the shorter Max-Queue-Wait the request asks for. Zero: none. A header of
// 0 or one that is not a whole number of seconds is ignored: a client can shorten the
// operator's bound, never lift it (docs/capacity.md).
func queueDeadline(cfg *CapacityConfig, r *http.Request, now time.Time) time.Time {
	if cfg == nil {
		return time.Time{}
	}
	wait := time.Duration(cfg.MaxQueueWait)
	if v := strings.TrimSpace(r.Header.Get(headerMaxQueueWait)); v != "" {
		secs, err := strconv.ParseUint(v, 10, 31)
		if asked := time.Duration(secs) * time.Second; err == nil && asked > 0 && (wait == 0 || asked < wait) {
			wait = asked
		}
	}
	if wait <= 0 {
		return time.Time{}
	}
	return now.Add(wait)
}

// statusWriter notes the status the route answers with; Unwrap keeps flushing and the rest of
// http.ResponseController working through it. Once cut is canceled because the call's shared
// seat lapsed, a route that had not answered yet passes nothing on (the proxy's 499 for a
// canceled call): the gateway answers instead.
type statusWriter struct {
	http.ResponseWriter
	status int
	cut    context.Context

	// What the adaptive limit reads of the answer (docs/capacity.md, "limit auto").
	now       func() time.Time
	firstByte time.Time
	stream    bool
	tokens    capacity.TokenScanner
}

// sample is how the call that started at start went, for the adaptive limit.
func (w *statusWriter) sample(start time.Time, ctxErr error) capacity.Sample {
	out := capacity.Sample{Status: w.status, Overloaded: capacity.Overloaded(w.status, ctxErr), Stream: w.stream, Tokens: w.tokens.Tokens()}
	if !w.firstByte.IsZero() {
		out.FirstByte = w.firstByte.Sub(start)
	}
	return out
}

// dropped reports whether a first write comes after the cut, and is not passed on.
func (w *statusWriter) dropped() bool {
	return w.status == 0 && w.cut != nil && seatLapsed(w.cut)
}

func (w *statusWriter) WriteHeader(code int) {
	if w.dropped() {
		return
	}
	if w.status == 0 && code >= 200 {
		w.status = code
		w.stream = capacity.StreamedAnswer(w.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.dropped() {
		return 0, context.Cause(w.cut)
	}
	if w.status == 0 {
		w.status = http.StatusOK
		w.stream = capacity.StreamedAnswer(w.Header())
	}
	if w.firstByte.IsZero() && len(b) > 0 && w.now != nil {
		w.firstByte = w.now()
	}
	if w.status >= 200 && w.status < 300 {
		_, _ = w.tokens.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

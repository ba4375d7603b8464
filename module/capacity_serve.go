package module

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capacity"
	"github.com/mulligan-gw/mulligan/internal/prefer"
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
	seats, err := h.reg.joinSeatPool(key, func() *seatPool {
		return newSeatPool(h.reg, key, where, set.name()+h.conv.prefix, h.conv.prefix, *h.Capacity)
	})
	if err != nil {
		return err
	}
	h.seats, h.seatKey = seats, key
	h.seats.configure(*h.Capacity)
	h.conv.capacity = h.Capacity
	return nil
}

// Cleanup lets go of the block's seats; calls still holding one keep it until they end.
func (h *Handler) Cleanup() error {
	if h.seats != nil {
		h.reg.releaseSeatPool(h.seatKey)
	}
	return nil
}

// syncSeatWait is how long a sync call waits for a seat: capacity.wait, or a shorter
// Prefer: wait=N.
func (h *Handler) syncSeatWait(r *http.Request) time.Duration {
	wait := time.Duration(h.Capacity.Wait)
	if p := prefer.Parse(r.Header.Values("Prefer")); p.HasWait && p.Wait < wait {
		wait = p.Wait
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
		s := capacity.TicketOf(r.Context()).Take()
		if s == nil {
			var err error
			if s, err = h.seats.Acquire(r.Context(), ask, h.syncSeatWait(r)); err != nil {
				h.saturated(w, r, err)
				return nil
			}
		}
		ctx, stop := s.Watch(r.Context())
		sw := &capacity.AnswerWriter{ResponseWriter: w, Cut: ctx, Now: h.now}
		defer func() { s.Release(sw.Sample(s.Start(), r.Context().Err())) }()
		err := next.ServeHTTP(sw, r.WithContext(ctx))
		stop()
		if sw.Status == 0 && capacity.SeatLapsed(ctx) {
			// Cut before it answered: the shared seats fail closed, as when one cannot be taken.
			w.Header().Set(headerRequestID, r.Header.Get(headerRequestID))
			h.storageFailed(w, context.Cause(ctx))
			return nil
		}
		return err
	})
}

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
func (h *Handler) reserveSeat(kr *keyedRequest, window time.Duration) (*capacity.Ticket, bool) {
	wait := max(min(h.syncSeatWait(kr.r), window), time.Millisecond)
	s, err := h.seats.Acquire(kr.r.Context(), h.liveAsk(kr.r, kr.scope, h.now()), wait)
	if err != nil {
		return nil, false // not a refusal: the call is queued, unless its client left
	}
	ctx, t := capacity.WithTicket(kr.r.Context(), s)
	kr.r = kr.r.WithContext(ctx)
	return t, true
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

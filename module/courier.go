package module

import (
	"context"
	"net/http"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/courier"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/internal/tracing"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/webhook"
)

// newCourier returns the courier of a storage's outbox (internal/courier), not started: events
// rendered as the gateway's envelope, traced and counted in the gateway's metrics.
func newCourier(st store.Outbox, clock clockwork.Clock, log *zap.Logger) *courier.Courier {
	return courier.New(courier.Options{
		Store: st, Worker: newID("wrk_", clock.Now()), Clock: clock, Log: log, Render: runner.RenderEvent,
		Trace: func(ctx context.Context, ev *store.Event) (http.Header, func(webhook.Outcome)) {
			span, header := tracing.StartDelivery(ctx, ev)
			return header, func(out webhook.Outcome) { tracing.EndDelivery(span, out) }
		},
		EventFields: func(ev *store.Event) []zap.Field {
			return tracing.Context{Parent: ev.Traceparent, State: ev.Tracestate}.Fields()
		},
		Attempted: func(endpoint string, result webhook.Result, n int) {
			metrics.attempts.WithLabelValues(endpoint, result.String()).Add(float64(n))
		},
		DeadLettered: func(endpoint string) { metrics.deadLetters.WithLabelValues(endpoint).Inc() },
	})
}

// courierEndpoints is how the courier delivers to each endpoint the storage's blocks declare:
// by its declaring block's settings.
func courierEndpoints(endpoints map[string]*webhookSetup) map[string]courier.Endpoint {
	out := make(map[string]courier.Endpoint, len(endpoints))
	for name, h := range endpoints {
		if t := h.Target(name); t != nil {
			out[name] = t.Endpoint
		}
	}
	return out
}

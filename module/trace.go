package module

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
)

// W3C Trace Context headers (https://www.w3.org/TR/trace-context/).
const (
	headerTraceparent = "traceparent"
	headerTracestate  = "tracestate"
)

// traceContext is a request's W3C Trace Context, kept with its operation so that the upstream
// call (even when it runs later), the operation's log lines and its webhook deliveries all join
// the client's trace (docs/operating.md).
type traceContext struct {
	parent string // traceparent; "" when the request had none (or a malformed one)
	state  string // tracestate, kept only with a valid traceparent
}

// traceOf reads r's trace context. With Caddy's tracing directive on, r's traceparent is
// already the gateway's own server span, a child of the client's.
func traceOf(r *http.Request) traceContext {
	carrier := propagation.HeaderCarrier(r.Header)
	ctx := propagation.TraceContext{}.Extract(context.Background(), carrier)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return traceContext{}
	}
	return traceContext{parent: carrier.Get(headerTraceparent), state: carrier.Get(headerTracestate)}
}

// traceOfOperation is the trace context stored with op.
func traceOfOperation(op *store.Operation) traceContext {
	return traceContext{parent: op.Traceparent, state: op.Tracestate}
}

// fields are the log fields of the trace: traceparent as sent, and its trace id alone, which
// log search tools index.
func (t traceContext) fields() []zap.Field {
	if t.parent == "" {
		return nil
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{headerTraceparent: t.parent}))
	return []zap.Field{zap.String("traceparent", t.parent), zap.String("trace_id", sc.TraceID().String())}
}

// setHeaders puts the trace context on an outgoing request's headers.
func (t traceContext) setHeaders(h http.Header) {
	if t.parent == "" {
		return
	}
	h.Set(headerTraceparent, t.parent)
	if t.state != "" {
		h.Set(headerTracestate, t.state)
	}
}

// eventHeader are the headers a delivery of ev carries beyond the signature: its operation's
// trace context, so the consumer's work joins the same trace (docs/webhooks.md).
func eventHeader(ev *store.Event) http.Header {
	h := http.Header{}
	traceContext{parent: ev.Traceparent, state: ev.Tracestate}.setHeaders(h)
	return h
}

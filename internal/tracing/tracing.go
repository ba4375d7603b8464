// Package tracing joins the gateway's work to its callers' traces (docs/operating.md,
// "Tracing"): the W3C Trace Context kept with an operation, the log fields of a trace, and the
// gateway's own spans (accept, queue wait, execute, deliver), sent to the tracer provider of
// Caddy's tracing directive when one is seen. OpenTelemetry and zap only; no Caddy.
package tracing

import (
	"context"
	"net/http"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/webhook"
)

// W3C Trace Context headers (https://www.w3.org/TR/trace-context/).
const (
	headerTraceparent = "traceparent"
	headerTracestate  = "tracestate"
)

// Context is a request's W3C Trace Context, kept with its operation so that the upstream
// call (even when it runs later), the operation's log lines and its webhook deliveries all join
// the client's trace (docs/operating.md).
type Context struct {
	Parent string // traceparent; "" when the request had none (or a malformed one)
	State  string // tracestate, kept only with a valid traceparent
}

// Of reads r's trace context. With Caddy's tracing directive on, r's traceparent is
// already the gateway's own server span, a child of the client's.
func Of(r *http.Request) Context {
	carrier := propagation.HeaderCarrier(r.Header)
	ctx := propagation.TraceContext{}.Extract(context.Background(), carrier)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return Context{}
	}
	return Context{Parent: carrier.Get(headerTraceparent), State: carrier.Get(headerTracestate)}
}

// OfOperation is the trace context stored with op.
func OfOperation(op *store.Operation) Context {
	return Context{Parent: op.Traceparent, State: op.Tracestate}
}

// fields are the log fields of the trace: traceparent as sent, and its trace id alone, which
// log search tools index.
func (t Context) Fields() []zap.Field {
	if t.Parent == "" {
		return nil
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{headerTraceparent: t.Parent}))
	return []zap.Field{zap.String("traceparent", t.Parent), zap.String("trace_id", sc.TraceID().String())}
}

// OperationFields are the fields of every log line about op: its id and its trace, then more.
func OperationFields(op *store.Operation, more ...zap.Field) []zap.Field {
	return append(append([]zap.Field{zap.String("operation_id", op.ID)}, OfOperation(op).Fields()...), more...)
}

// setHeaders puts the trace context on an outgoing request's headers.
func (t Context) SetHeaders(h http.Header) {
	if t.Parent == "" {
		return
	}
	h.Set(headerTraceparent, t.Parent)
	if t.State != "" {
		h.Set(headerTracestate, t.State)
	}
}

// EventHeader are the headers a delivery of ev carries beyond the signature: its operation's
// trace context, so the consumer's work joins the same trace (docs/webhooks.md).
func EventHeader(ev *store.Event) http.Header {
	h := http.Header{}
	Context{Parent: ev.Traceparent, State: ev.Tracestate}.SetHeaders(h)
	return h
}

// The gateway's own spans (docs/operating.md): each joins the trace of the request that
// submitted the operation, as a child of the span its traceparent names (the client's, or with
// Caddy's tracing directive the gateway's server span). An operation without a trace gets none:
// spans of their own, unlinked, would only be noise.
const (
	SpanAccept    = "mulligan.accept"
	SpanQueueWait = "mulligan.queue_wait"
	SpanExecute   = "mulligan.execute"
	SpanDeliver   = "mulligan.deliver"
	tracerName    = "github.com/mulligan-gw/mulligan"
)

// noSpan is the span of work without a trace: it records nothing.
var noSpan = trace.SpanFromContext(context.Background())

// SeenProvider is the tracer provider of the last traced request. Caddy's tracing directive
// keeps its provider to itself rather than installing it as OpenTelemetry's global one; the
// runner and the courier, which work outside any request, send their spans to it too.
var SeenProvider atomic.Pointer[trace.TracerProvider]

// tracerFor returns the tracer for spans under ctx: the provider of ctx's span when it records
// (Caddy's tracing directive), else the last such provider seen, else OpenTelemetry's global.
func tracerFor(ctx context.Context) trace.Tracer {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		p := span.TracerProvider()
		SeenProvider.Store(&p)
		return p.Tracer(tracerName)
	}
	if p := SeenProvider.Load(); p != nil {
		return (*p).Tracer(tracerName)
	}
	return otel.GetTracerProvider().Tracer(tracerName)
}

// contextWith returns ctx carrying t as the remote parent of the spans started under it.
func (t Context) ContextWith(ctx context.Context) context.Context {
	if t.Parent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{headerTraceparent: t.Parent, headerTracestate: t.State})
}

// opAttributes name the operation on its spans.
func opAttributes(op *store.Operation) trace.SpanStartEventOption {
	return trace.WithAttributes(attribute.String("mulligan.operation_id", op.ID), attribute.String("mulligan.operation_type", op.Type))
}

// StartAccept starts the span of a request's acceptance as an operation, a child of the
// request's span (Caddy's tracing directive) or of its traceparent.
func StartAccept(ctx context.Context, t Context) trace.Span {
	tracer := tracerFor(ctx)
	if !trace.SpanFromContext(ctx).SpanContext().IsValid() {
		if t.Parent == "" {
			return noSpan
		}
		ctx = t.ContextWith(ctx)
	}
	_, span := tracer.Start(ctx, SpanAccept, trace.WithSpanKind(trace.SpanKindServer))
	return span
}

// EndAccept ends the acceptance span of op (nil when nothing was stored).
func EndAccept(span trace.Span, op *store.Operation) {
	if op != nil {
		span.SetAttributes(attribute.String("mulligan.operation_id", op.ID), attribute.String("mulligan.operation_type", op.Type))
	}
	span.End()
}

// RecordQueueWait records the time op waited in the queue as a span, after the fact.
func RecordQueueWait(op *store.Operation) {
	if op.Traceparent == "" {
		return
	}
	ctx := OfOperation(op).ContextWith(context.Background())
	_, span := tracerFor(ctx).Start(ctx, SpanQueueWait, trace.WithTimestamp(op.SubmittedAt), opAttributes(op))
	span.End(trace.WithTimestamp(op.StartedAt))
}

// StartExecution starts the span of op's execution; the upstream attempts under it carry it
// as their traceparent.
func StartExecution(ctx context.Context, op *store.Operation) (context.Context, trace.Span) {
	if op.Traceparent == "" {
		return ctx, noSpan
	}
	ctx = OfOperation(op).ContextWith(ctx)
	return tracerFor(ctx).Start(ctx, SpanExecute, trace.WithSpanKind(trace.SpanKindInternal), opAttributes(op))
}

// EndExecution ends the execution span with the change the execution came to (a zero one
// when it lost the operation to another worker).
func EndExecution(span trace.Span, last store.Change) {
	span.SetAttributes(attribute.String("mulligan.status", string(last.To)))
	if last.Error != nil {
		span.SetStatus(codes.Error, last.Error.Code)
	}
	span.End()
}

// Inject sets r's traceparent to the span in r's context, when there is one; otherwise r
// keeps the stored request's own.
func Inject(r *http.Request) {
	if trace.SpanContextFromContext(r.Context()).IsValid() {
		propagation.TraceContext{}.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	}
}

// StartDelivery starts the span of one delivery of ev, and returns the headers that carry it
// to the consumer.
func StartDelivery(ctx context.Context, ev *store.Event) (trace.Span, http.Header) {
	h := EventHeader(ev)
	if ev.Traceparent == "" {
		return noSpan, h
	}
	ctx = Context{Parent: ev.Traceparent, State: ev.Tracestate}.ContextWith(ctx)
	ctx, span := tracerFor(ctx).Start(ctx, SpanDeliver, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("mulligan.event_id", ev.ID), attribute.String("mulligan.event_type", ev.Type),
			attribute.String("mulligan.operation_id", ev.OperationID), attribute.String("mulligan.endpoint", ev.Endpoint)))
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
	return span, h
}

// EndDelivery ends a delivery span with what came of it.
func EndDelivery(span trace.Span, out webhook.Outcome) {
	span.SetAttributes(attribute.String("mulligan.result", out.Result.String()), attribute.Int("http.response.status_code", out.StatusCode))
	if out.Result != webhook.Delivered {
		span.SetStatus(codes.Error, out.Result.String())
	}
	span.End()
}

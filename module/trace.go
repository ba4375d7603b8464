package module

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

// operationFields are the fields of every log line about op: its id and its trace, then more.
func operationFields(op *store.Operation, more ...zap.Field) []zap.Field {
	return append(append([]zap.Field{zap.String("operation_id", op.ID)}, traceOfOperation(op).fields()...), more...)
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

// The gateway's own spans (docs/operating.md): each joins the trace of the request that
// submitted the operation, as a child of the span its traceparent names (the client's, or with
// Caddy's tracing directive the gateway's server span). An operation without a trace gets none:
// spans of their own, unlinked, would only be noise.
const (
	spanAccept    = "mulligan.accept"
	spanQueueWait = "mulligan.queue_wait"
	spanExecute   = "mulligan.execute"
	spanDeliver   = "mulligan.deliver"
	tracerName    = "github.com/mulligan-gw/mulligan"
)

// noSpan is the span of work without a trace: it records nothing.
var noSpan = trace.SpanFromContext(context.Background())

// seenProvider is the tracer provider of the last traced request. Caddy's tracing directive
// keeps its provider to itself rather than installing it as OpenTelemetry's global one; the
// runner and the courier, which work outside any request, send their spans to it too.
var seenProvider atomic.Pointer[trace.TracerProvider]

// tracerFor returns the tracer for spans under ctx: the provider of ctx's span when it records
// (Caddy's tracing directive), else the last such provider seen, else OpenTelemetry's global.
func tracerFor(ctx context.Context) trace.Tracer {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		p := span.TracerProvider()
		seenProvider.Store(&p)
		return p.Tracer(tracerName)
	}
	if p := seenProvider.Load(); p != nil {
		return (*p).Tracer(tracerName)
	}
	return otel.GetTracerProvider().Tracer(tracerName)
}

// contextWith returns ctx carrying t as the remote parent of the spans started under it.
func (t traceContext) contextWith(ctx context.Context) context.Context {
	if t.parent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{headerTraceparent: t.parent, headerTracestate: t.state})
}

// opAttributes name the operation on its spans.
func opAttributes(op *store.Operation) trace.SpanStartEventOption {
	return trace.WithAttributes(attribute.String("mulligan.operation_id", op.ID), attribute.String("mulligan.operation_type", op.Type))
}

// startAccept starts the span of a request's acceptance as an operation, a child of the
// request's span (Caddy's tracing directive) or of its traceparent.
func startAccept(kr *keyedRequest) trace.Span {
	ctx := kr.r.Context()
	tracer := tracerFor(ctx)
	if !trace.SpanFromContext(ctx).SpanContext().IsValid() {
		if kr.trace.parent == "" {
			return noSpan
		}
		ctx = kr.trace.contextWith(ctx)
	}
	_, span := tracer.Start(ctx, spanAccept, trace.WithSpanKind(trace.SpanKindServer))
	return span
}

// endAccept ends the acceptance span of op (nil when nothing was stored).
func endAccept(span trace.Span, op *store.Operation) {
	if op != nil {
		span.SetAttributes(attribute.String("mulligan.operation_id", op.ID), attribute.String("mulligan.operation_type", op.Type))
	}
	span.End()
}

// recordQueueWait records the time op waited in the queue as a span, after the fact.
func recordQueueWait(op *store.Operation) {
	if op.Traceparent == "" {
		return
	}
	ctx := traceOfOperation(op).contextWith(context.Background())
	_, span := tracerFor(ctx).Start(ctx, spanQueueWait, trace.WithTimestamp(op.SubmittedAt), opAttributes(op))
	span.End(trace.WithTimestamp(op.StartedAt))
}

// startExecution starts the span of op's execution; the upstream attempts under it carry it
// as their traceparent.
func startExecution(ctx context.Context, op *store.Operation) (context.Context, trace.Span) {
	if op.Traceparent == "" {
		return ctx, noSpan
	}
	ctx = traceOfOperation(op).contextWith(ctx)
	return tracerFor(ctx).Start(ctx, spanExecute, trace.WithSpanKind(trace.SpanKindInternal), opAttributes(op))
}

// endExecution ends the execution span with the change the execution came to (a zero one
// when it lost the operation to another worker).
func endExecution(span trace.Span, last store.Change) {
	span.SetAttributes(attribute.String("mulligan.status", string(last.To)))
	if last.Error != nil {
		span.SetStatus(codes.Error, last.Error.Code)
	}
	span.End()
}

// injectTrace sets r's traceparent to the span in r's context, when there is one; otherwise r
// keeps the stored request's own.
func injectTrace(r *http.Request) {
	if trace.SpanContextFromContext(r.Context()).IsValid() {
		propagation.TraceContext{}.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	}
}

// startDelivery starts the span of one delivery of ev, and returns the headers that carry it
// to the consumer.
func startDelivery(ctx context.Context, ev *store.Event) (trace.Span, http.Header) {
	h := eventHeader(ev)
	if ev.Traceparent == "" {
		return noSpan, h
	}
	ctx = traceContext{parent: ev.Traceparent, state: ev.Tracestate}.contextWith(ctx)
	ctx, span := tracerFor(ctx).Start(ctx, spanDeliver, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("mulligan.event_id", ev.ID), attribute.String("mulligan.event_type", ev.Type),
			attribute.String("mulligan.operation_id", ev.OperationID), attribute.String("mulligan.endpoint", ev.Endpoint)))
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
	return span, h
}

// endDelivery ends a delivery span with what came of it.
func endDelivery(span trace.Span, out webhook.Outcome) {
	span.SetAttributes(attribute.String("mulligan.result", out.Result.String()), attribute.Int("http.response.status_code", out.StatusCode))
	if out.Result != webhook.Delivered {
		span.SetStatus(codes.Error, out.Result.String())
	}
	span.End()
}

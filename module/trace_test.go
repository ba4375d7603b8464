package module

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/internal/tracing"
)

// headerLog keeps one header of every request that passes through it.
type headerLog struct {
	name string
	mu   sync.Mutex
	seen []string
}

func (hl *headerLog) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hl.add(r)
		next.ServeHTTP(w, r)
	})
}

func (hl *headerLog) add(r *http.Request) {
	hl.mu.Lock()
	defer hl.mu.Unlock()
	hl.seen = append(hl.seen, r.Header.Get(hl.name))
}

func (hl *headerLog) values() []string {
	hl.mu.Lock()
	defer hl.mu.Unlock()
	return append([]string(nil), hl.seen...)
}

// logLines reads a JSON log file's lines that have field == value.
func logLines(t *testing.T, path, field, value string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line[field] == value {
			lines = append(lines, line)
		}
	}
	return lines
}

const (
	clientTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	clientTracestate  = "congo=t61rcWkgMzE"
)

func TestTraceparentFollowsTheOperationUpstreamIntoLogsAndOntoWebhooks(t *testing.T) {
	upstream := &headerLog{name: "traceparent"}
	upstreamState := &headerLog{name: "tracestate"}
	delivered := &headerLog{name: "traceparent"}
	rc := newReceiver(t, secretA, func(r *http.Request) int { delivered.add(r); return http.StatusNoContent })
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	g := startGatewayWith(t, gatewaySetup{
		globals:  "log {\n output file " + logFile + "\n format json\n level INFO\n }",
		mulligan: "async {\n concurrency 1\n}\n" + webhooksBlock(rc.srv.URL+"/hook", "", secretA),
		wrap:     func(next http.Handler) http.Handler { return upstream.wrap(upstreamState.wrap(next)) },
	})

	// The first operation holds the only slot, so the traced one waits in the queue and its
	// upstream call is made later, from the stored request.
	_, blocker := g.submit(t, "blocker", "X-Mock-Latency", "300ms")
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	_, op := g.submit(t, "traced", "traceparent", clientTraceparent, "tracestate", clientTracestate)
	g.await(t, blocker.OperationID)
	g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 2", func() bool { return rc.delivered() == 2 })

	if got := upstream.values(); len(got) != 2 || got[0] != "" || got[1] != clientTraceparent || upstreamState.values()[1] != clientTracestate {
		t.Errorf("the upstream saw traceparent %q, tracestate %q", got, upstreamState.values())
	}
	var withTrace int
	for _, tp := range delivered.values() {
		if tp == clientTraceparent {
			withTrace++
		}
	}
	if withTrace != 1 {
		t.Errorf("deliveries' traceparent %q: want one with the client's", delivered.values())
	}
	// Every log line about the operation carries its trace.
	// (The last line may follow the delivery by a moment: the event commits with the status.)
	var lines []map[string]any
	testkit.WaitFor(t, 5*time.Second, "the operation's three log lines", func() bool {
		lines = logLines(t, logFile, "operation_id", op.OperationID)
		return len(lines) >= 3 // accepted, running, succeeded
	})
	for _, line := range lines {
		if line["traceparent"] != clientTraceparent || line["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("log line without the trace: %v", line)
		}
	}
	if other := logLines(t, logFile, "operation_id", blocker.OperationID); len(other) == 0 || other[0]["traceparent"] != nil {
		t.Errorf("an untraced operation's log lines: %v", other)
	}
}

// inMemorySpans installs an in-memory exporter as OpenTelemetry's global tracer provider for
// the test, and forgets any provider an earlier traced request left behind.
func inMemorySpans(t *testing.T) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	tracing.SeenProvider.Store(nil)
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		tracing.SeenProvider.Store(nil)
	})
	return exp
}

// spansByName waits until the exporter holds a span of each name, and returns the first of each.
func spansByName(t *testing.T, exp *tracetest.InMemoryExporter, names ...string) map[string]tracetest.SpanStub {
	t.Helper()
	found := map[string]tracetest.SpanStub{}
	testkit.WaitFor(t, 5*time.Second, "the spans", func() bool {
		clear(found)
		for _, s := range exp.GetSpans() {
			if _, ok := found[s.Name]; !ok {
				found[s.Name] = s
			}
		}
		return len(found) >= len(names)
	})
	return found
}

// spanIDOf is the parent-id field of a traceparent.
func spanIDOf(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 {
		return ""
	}
	return parts[2]
}

func TestGatewaySpansJoinTheClientsTrace(t *testing.T) {
	exp := inMemorySpans(t)
	upstream, delivered := &headerLog{name: "traceparent"}, &headerLog{name: "traceparent"}
	rc := newReceiver(t, secretA, func(r *http.Request) int { delivered.add(r); return http.StatusNoContent })
	g := startGatewayWith(t, gatewaySetup{
		mulligan: webhooksBlock(rc.srv.URL+"/hook", "", secretA),
		wrap:     upstream.wrap,
	})
	_, untraced := g.submit(t, "")
	g.await(t, untraced.OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 1", func() bool { return rc.delivered() == 1 })
	_, op := g.submit(t, "", "traceparent", clientTraceparent)
	g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 2", func() bool { return rc.delivered() == 2 })
	spans := spansByName(t, exp, tracing.SpanAccept, tracing.SpanQueueWait, tracing.SpanExecute, tracing.SpanDeliver)
	for _, s := range exp.GetSpans() {
		if hasAttribute(s, "mulligan.operation_id", untraced.OperationID) {
			t.Errorf("an operation without a trace has span %s", s.Name)
		}
	}

	client, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	for name, s := range spans {
		if s.SpanContext.TraceID() != client || s.Parent.SpanID().String() != spanIDOf(clientTraceparent) {
			t.Errorf("%s: trace %s parent %s, want a child of the client's span", name, s.SpanContext.TraceID(), s.Parent.SpanID())
		}
		if !hasAttribute(s, "mulligan.operation_id", op.OperationID) {
			t.Errorf("%s does not name the operation: %v", name, s.Attributes)
		}
	}
	// The upstream call is a child of the execution span, the delivery carries its own span.
	if got := upstream.values(); len(got) != 2 || got[0] != "" || spanIDOf(got[1]) != spans[tracing.SpanExecute].SpanContext.SpanID().String() {
		t.Errorf("upstream traceparent %q, execution span %s", got, spans[tracing.SpanExecute].SpanContext.SpanID())
	}
	if got := delivered.values(); len(got) != 2 || got[0] != "" || spanIDOf(got[1]) != spans[tracing.SpanDeliver].SpanContext.SpanID().String() {
		t.Errorf("delivery traceparent %q, delivery span %s", got, spans[tracing.SpanDeliver].SpanContext.SpanID())
	}
	wait := spans[tracing.SpanQueueWait]
	if wait.EndTime.Before(wait.StartTime) || wait.EndTime.After(spans[tracing.SpanExecute].StartTime) {
		t.Errorf("queue wait %v..%v, execution from %v", wait.StartTime, wait.EndTime, spans[tracing.SpanExecute].StartTime)
	}
	if !hasAttribute(spans[tracing.SpanExecute], "mulligan.status", "succeeded") || !hasAttribute(spans[tracing.SpanDeliver], "mulligan.result", "delivered") {
		t.Errorf("outcomes: %v / %v", spans[tracing.SpanExecute].Attributes, spans[tracing.SpanDeliver].Attributes)
	}
}

func hasAttribute(s tracetest.SpanStub, key, value string) bool {
	for _, a := range s.Attributes {
		if string(a.Key) == key && a.Value.Emit() == value {
			return true
		}
	}
	return false
}

func TestCaddyTracingDirectiveSpansLeadToTheOperation(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none") // Caddy's own provider exports nowhere in a test
	t.Cleanup(func() { tracing.SeenProvider.Store(nil) })
	upstream, delivered := &headerLog{name: "traceparent"}, &headerLog{name: "traceparent"}
	rc := newReceiver(t, secretA, func(r *http.Request) int { delivered.add(r); return http.StatusNoContent })
	g := startGatewayWith(t, gatewaySetup{
		site:     "tracing {\n span gateway\n }",
		mulligan: webhooksBlock(rc.srv.URL+"/hook", "", secretA),
		wrap:     upstream.wrap,
	})
	_, op := g.submit(t, "", "traceparent", clientTraceparent)
	g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 1", func() bool { return rc.delivered() == 1 })
	// Caddy's server span is the operation's parent: the upstream call and the delivery are in
	// the client's trace, under spans of the gateway's.
	for what, got := range map[string][]string{"upstream": upstream.values(), "delivery": delivered.values()} {
		if len(got) != 1 || !strings.HasPrefix(got[0], "00-4bf92f3577b34da6a3ce929d0e0e4736-") || got[0] == clientTraceparent {
			t.Errorf("%s traceparent %q: want the client's trace under a gateway span", what, got)
		}
	}
}

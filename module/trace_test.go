package module

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
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
	g := startGatewayWrapped(t, modelserver.Config{}, "log {\n output file "+logFile+"\n format json\n level INFO\n }",
		"async {\n concurrency 1\n}\n"+webhooksBlock(rc.srv.URL+"/hook", "", secretA),
		func(next http.Handler) http.Handler { return upstream.wrap(upstreamState.wrap(next)) })

	// The first operation holds the only slot, so the traced one waits in the queue and its
	// upstream call is made later, from the stored request.
	_, blocker := g.submit(t, "blocker", "X-Mock-Latency", "300ms")
	waitFor(t, func() bool { return g.model.Stats().InFlight == 1 })
	_, op := g.submit(t, "traced", "traceparent", clientTraceparent, "tracestate", clientTracestate)
	g.await(t, blocker.OperationID)
	g.await(t, op.OperationID)
	waitFor(t, func() bool { return rc.delivered() == 2 })

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
	lines := logLines(t, logFile, "operation_id", op.OperationID)
	if len(lines) < 3 {
		t.Fatalf("%d log lines about the operation, want accepted, running and succeeded", len(lines))
	}
	for _, line := range lines {
		if line["traceparent"] != clientTraceparent || line["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("log line without the trace: %v", line)
		}
	}
	if other := logLines(t, logFile, "operation_id", blocker.OperationID); len(other) == 0 || other[0]["traceparent"] != nil {
		t.Errorf("an untraced operation's log lines: %v", other)
	}
}

package module

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/store"
)

// latencyFor spreads latencies over 1 to 9 ms, every tenth call 25 ms: calls of unequal
// length finish out of order.
func latencyFor(i int) string {
	if i%10 == 9 {
		return "25ms"
	}
	return fmt.Sprintf("%dms", 1+i%9)
}

// TestThousandOperationsAllSucceedWithTheirOwnResults runs 1,000 operations at concurrency 4
// through the runner alone (the model server in process, real Badger): every one succeeds with
// the answer to its own prompt, and the model server counts exactly 1,000 executions.
func TestThousandOperationsAllSucceedWithTheirOwnResults(t *testing.T) {
	t.Parallel()
	const n = 1000
	model := modelserver.New(modelserver.Config{})
	lr := newLoopRunner(t, realClock, model, 4, nil)
	lr.Start()
	for i := range n {
		lr.AcceptWith(t, fmt.Sprintf("op_%04d", i), testExecution(time.Minute, 3), http.Header{modelserver.HeaderMockLatency: {latencyFor(i)}}, chat(fmt.Sprintf("prompt %d", i)))
	}
	for i := range n {
		id := fmt.Sprintf("op_%04d", i)
		if op := lr.Await(t, id); op.Status != store.StatusSucceeded {
			t.Fatalf("operation %d: %s %+v", i, op.Status, op.Error)
		}
		res, err := lr.st.LoadResult(id)
		if want := fmt.Sprintf("prompt %d", i); err != nil || res.Status != 200 || !strings.Contains(string(res.Body), want) {
			t.Fatalf("operation %d's result does not answer its prompt: %v %s", i, err, res.Body)
		}
	}
	s := model.Stats()
	t.Logf("%d operations succeeded; the model server counted %d executions", n, s.Received)
	if s.Received != n {
		t.Fatalf("the model server ran %d times for %d operations", s.Received, n)
	}
}

func TestReloadMidRunLosesNoOperation(t *testing.T) {
	g := startGateway(t, modelserver.Config{Latency: 30 * time.Millisecond}, "async {\n concurrency 4\n}")
	var ids []string
	for i := range 200 {
		_, op := g.submit(t, fmt.Sprintf("reload-%d", i))
		ids = append(ids, op.OperationID)
		if i%50 == 25 {
			g.reload(fmt.Sprintf("async {\n concurrency %d\n}", 2+i%3))
		}
	}
	g.reload("async {\n concurrency 8\n}")
	for _, id := range ids {
		if op := g.await(t, id); op.Status != "succeeded" {
			t.Fatalf("%s: %s", id, op.Status)
		}
	}
	s := g.model.Stats()
	t.Logf("200 operations across 5 reloads: all succeeded; %d executions", s.Received)
	if s.Received != 200 {
		t.Fatalf("the model server ran %d times for 200 operations", s.Received)
	}
}

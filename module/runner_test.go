package module

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// latencyFor spreads latencies over 50 ms to 2 s: most calls are quick, every tenth is slow,
// so 1,000 of them finish in about a minute at concurrency 4.
func latencyFor(i int) string {
	if i%10 == 9 {
		return "2s"
	}
	return fmt.Sprintf("%dms", 50+(i%9)*10)
}

func TestThousandOperationsAllSucceedWithTheirOwnResults(t *testing.T) {
	if testing.Short() {
		t.Skip("about a minute of upstream time")
	}
	const n = 1000
	g := startGateway(t, modelserver.Config{}, "async {\n concurrency 4\n}")
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r := g.post(chatPath, fmt.Sprintf("bulk-%d", i), chat(fmt.Sprintf("prompt %d", i)), "Prefer", "respond-async", "X-Mock-Latency", latencyFor(i))
			if r.err != nil || r.StatusCode != 202 {
				t.Errorf("submit %d: %v %v", i, r.err, r.Status)
				return
			}
			ids[i] = decodeOp(t, r).OperationID
		})
	}
	wg.Wait()
	deadline := time.Now().Add(3 * time.Minute)
	for i, id := range ids {
		var op opBody
		for {
			op = decodeOp(t, g.get("/v1/operations/"+id))
			if op.Done || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if op.Status != "succeeded" {
			t.Fatalf("operation %d: %s", i, op.Status)
		}
		res := g.get("/v1/operations/" + id + "/result")
		if want := fmt.Sprintf("prompt %d", i); res.StatusCode != 200 || !strings.Contains(string(res.body), want) {
			t.Fatalf("operation %d's result does not answer its prompt: %s", i, res.body)
		}
	}
	s := g.model.Stats()
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

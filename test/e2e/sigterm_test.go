package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// TestSIGTERMFinishesOrRequeuesAndLosesNothing stops the gateway with SIGTERM while operations
// run and wait: it exits within its grace period, and after a restart every operation ends.
func TestSIGTERMFinishesOrRequeuesAndLosesNothing(t *testing.T) {
	// Not in parallel: it counts the calls a stop within the grace period cuts.
	const n = 60
	model, upstream := startModelServer(t, modelserver.Config{Latency: 300 * time.Millisecond})
	p := newGatewayProcess(t, upstream, "async {\n concurrency 4\n}", "grace_period 2s")
	p.start()
	var ids []string
	for i := range n {
		_, body, err := p.send("POST", "/v1/chat/completions", fmt.Sprintf("term-%d", i), `{"messages":[]}`, "Prefer", "respond-async")
		var op struct {
			OperationID string `json:"operation_id"`
		}
		if err != nil || json.Unmarshal(body, &op) != nil || op.OperationID == "" {
			t.Fatalf("submit: %v %s", err, body)
		}
		ids = append(ids, op.OperationID)
	}
	testkit.WaitFor(t, 15*time.Second, "some operations ran", func() bool { return model.Stats().Completed >= 8 })
	_, took := p.terminate(15 * time.Second)
	done := model.Stats().Completed
	t.Logf("SIGTERM with %d of %d upstream calls finished: exited in %s (grace period 2s)", done, n, took.Round(time.Millisecond))

	p.start()
	for _, id := range ids {
		testkit.WaitFor(t, 15*time.Second, "the operation finished after the restart", func() bool {
			_, body, err := p.send("GET", "/v1/operations/"+id, "", "")
			return err == nil && bytes.Contains(body, []byte(`"status":"succeeded"`))
		})
	}
	reran := 0
	for i := range n {
		if c := model.Stats().ByKey[fmt.Sprintf("term-%d", i)]; c > 1 {
			reran += int(c) - 1
		}
	}
	t.Logf("after the restart all %d succeeded; %d upstream calls were re-run", n, reran)
	if reran > 4 {
		t.Fatalf("%d re-runs: more than the calls that could have been cut (concurrency 4)", reran)
	}
}

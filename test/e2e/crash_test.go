package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/webhook"
)

// TestKilledGatewayKeepsItsKeys kills the real process (SIGKILL) while a keyed upstream call is
// in flight and restarts it on the same data directory.
func TestKilledGatewayKeepsItsKeys(t *testing.T) {
	t.Parallel()
	model, upstream := startModelServer(t, modelserver.Config{Latency: 2 * time.Second})
	p := newGatewayProcess(t, upstream, "idempotency {\n lease 10s\n}") // the kill, the restart and the retry fit in it on a loaded machine
	p.start()

	// A key completed before the crash.
	resp, done, err := p.post("done-before", "finished", 10*time.Second)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("before the crash: %v %v", err, resp)
	}

	// A key in flight when the gateway dies.
	go p.post("mid-flight", "interrupted", 10*time.Second)
	testkit.WaitFor(t, 15*time.Second, "the upstream call started", func() bool { return model.Stats().ByKey["mid-flight"] == 1 })
	p.kill()
	p.start()

	resp, body, err := p.post("mid-flight", "interrupted", 10*time.Second)
	if err != nil || resp.StatusCode != 409 || !bytes.Contains(body, []byte("IDEMPOTENCY_REQUEST_IN_PROGRESS")) {
		t.Fatalf("within the lease after restart: %v %v %s", err, resp, body)
	}
	t.Logf("within the lease: %d %s", resp.StatusCode, bytes.TrimSpace(body))

	resp, body, err = p.post("done-before", "finished", 10*time.Second)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(body, done) {
		t.Fatalf("a key completed before the crash did not replay: %v %v", err, resp)
	}

	// After the lease the orphaned claim expires and the retry runs again.
	testkit.WaitFor(t, 25*time.Second, "the lease expired", func() bool {
		resp, _, err := p.post("mid-flight", "interrupted", 10*time.Second)
		return err == nil && resp.StatusCode == 200
	})
	stats := model.Stats()
	t.Logf("upstream executions of the interrupted key: %d (1 cut by the crash, 1 after the lease); of the completed key: %d", stats.ByKey["mid-flight"], stats.ByKey["done-before"])
	if stats.ByKey["mid-flight"] != 2 || stats.ByKey["done-before"] != 1 {
		t.Fatalf("executions by key: %v", stats.ByKey)
	}
	resp, _, _ = p.post("mid-flight", "interrupted", 10*time.Second)
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("the rerun was not recorded")
	}
}

// TestKilledGatewayLosesNoOperation kills the real process while 500 operations are queued or
// running, restarts it on the same data directory, and checks that every one of them ends, each
// upstream call re-run at most once, and only the ones the crash interrupted.
func TestKilledGatewayLosesNoOperation(t *testing.T) {
	t.Parallel()
	const n = 500
	model, upstream := startModelServer(t, modelserver.Config{Latency: 50 * time.Millisecond})
	p := newGatewayProcess(t, upstream, "async {\n concurrency 4\n}")
	p.start()

	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			resp, body, err := p.send("POST", "/v1/chat/completions", fmt.Sprintf("op-%d", i), fmt.Sprintf(`{"messages":[{"role":"user","content":"op %d"}]}`, i), "Prefer", "respond-async")
			if err != nil || resp.StatusCode != 202 {
				t.Errorf("submit %d: %v %v %s", i, err, resp, body)
				return
			}
			var op struct {
				OperationID string `json:"operation_id"`
			}
			_ = json.Unmarshal(body, &op)
			ids[i] = op.OperationID
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	testkit.WaitFor(t, 15*time.Second, "some operations ran", func() bool { return model.Stats().Completed >= 40 })
	p.kill()
	before := model.Stats()
	p.start()

	statuses := map[string]int{}
	restarted := time.Now()
	for _, id := range ids {
		var op struct {
			Status string `json:"status"`
			Done   bool   `json:"done"`
		}
		testkit.WaitFor(t, time.Until(restarted.Add(time.Minute)), "operation "+id+" final a minute after the restart", func() bool {
			_, body, err := p.send("GET", "/v1/operations/"+id, "", "")
			return err == nil && json.Unmarshal(body, &op) == nil && op.Done
		})
		statuses[op.Status]++
	}
	after := model.Stats()
	rerun := countReruns(t, after.ByKey, "op-", n)
	t.Logf("killed with %d of %d upstream calls finished; after restart: %v, %d upstream executions in all, %d operations re-run",
		before.Completed, n, statuses, after.Received, rerun)
	if statuses["succeeded"] != n {
		t.Fatalf("not all succeeded: %v", statuses)
	}
	if rerun > 4 {
		t.Fatalf("%d operations re-ran, more than could have been running (concurrency 4)", rerun)
	}
}

// TestKilledGatewayDeliversPendingEventsAfterRestart kills the process while the receiver is
// down and events wait in the outbox; after the restart every event is delivered.
func TestKilledGatewayDeliversPendingEventsAfterRestart(t *testing.T) {
	t.Parallel()
	const n = 50
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	parsed, err := webhook.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	var up atomic.Bool
	var mu sync.Mutex
	seen := map[string]bool{}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !up.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if webhook.Verify([]webhook.Secret{parsed}, r.Header, body, time.Now()) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		seen[r.Header.Get("webhook-id")] = true
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()
	_, upstream := startModelServer(t, modelserver.Config{})
	p := newGatewayProcess(t, upstream, fmt.Sprintf("webhooks {\n endpoint rx %s/hook {\n secret %s\n }\n default rx\n allow_private\n backoff 200ms 1s\n breaker 100 1s\n}", receiver.URL, secret))
	p.start()
	var ids []string
	for i := range n {
		_, body, err := p.send("POST", "/v1/chat/completions", fmt.Sprintf("evt-%d", i), `{"messages":[]}`, "Prefer", "respond-async")
		var op struct {
			OperationID string `json:"operation_id"`
		}
		if err != nil || json.Unmarshal(body, &op) != nil {
			t.Fatalf("submit: %v %s", err, body)
		}
		ids = append(ids, op.OperationID)
	}
	for _, id := range ids {
		testkit.WaitFor(t, 15*time.Second, "the operation finished", func() bool {
			_, body, err := p.send("GET", "/v1/operations/"+id, "", "")
			return err == nil && bytes.Contains(body, []byte(`"done":true`))
		})
	}
	p.kill() // every event is in the outbox, none delivered
	up.Store(true)
	p.start()
	testkit.WaitFor(t, 15*time.Second, "every event delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	})
	t.Logf("%d events pending at the kill, %d delivered after the restart", n, len(seen))
}

// TestEveryAnsweredKeyReplaysAfterAKillUnderLoad kills the process while 32 clients send keyed
// requests as fast as they can: every key answered before the kill must replay after the
// restart, byte for byte (durability sync: no answer before its fsync, group commit or not).
func TestEveryAnsweredKeyReplaysAfterAKillUnderLoad(t *testing.T) {
	t.Parallel()
	model, upstream := startModelServer(t, modelserver.Config{})
	p := newGatewayProcess(t, upstream, "durability sync")
	p.start()
	var mu sync.Mutex
	answered := map[string][]byte{}
	load := testkit.StartKeyedLoad(32, 100_000, "load", func(key string) bool {
		resp, body, err := p.sendWithin(5*time.Second, "POST", "/v1/chat/completions", key, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, key))
		if err != nil {
			return false // the gateway died under us
		}
		if resp.StatusCode == 200 {
			mu.Lock()
			answered[key] = body
			mu.Unlock()
		}
		return true
	})
	testkit.WaitFor(t, 15*time.Second, "load under way", func() bool { return model.Stats().Completed >= 3000 })
	p.kill()
	load.Stop()
	p.start()
	lost := 0
	for key, body := range answered {
		resp, again, err := p.send("POST", "/v1/chat/completions", key, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, key))
		if err != nil || resp.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again, body) {
			lost++
		}
	}
	t.Logf("killed after %d keys were answered; after the restart %d replayed, %d did not", len(answered), len(answered)-lost, lost)
	if lost != 0 {
		t.Fatalf("%d answered keys were lost by the crash", lost)
	}
}

// countReruns counts the keys prefix0 .. prefix(n-1) the model ran twice (a run cut by a kill,
// then the rerun), and fails the test for any that ran neither once nor twice.
func countReruns(t *testing.T, byKey map[string]int64, prefix string, n int) int {
	t.Helper()
	reruns := 0
	for i := range n {
		switch runs := byKey[fmt.Sprintf("%s%d", prefix, i)]; {
		case runs == 2:
			reruns++
		case runs != 1:
			t.Errorf("%s%d ran %d times", prefix, i, runs)
		}
	}
	return reruns
}

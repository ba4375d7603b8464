package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// TestKilledGatewayKeepsItsKeys kills the real process (SIGKILL) while a keyed upstream call is
// in flight and restarts it on the same data directory.
func TestKilledGatewayKeepsItsKeys(t *testing.T) {
	model, upstream := startModelServer(t, modelserver.Config{Latency: 2 * time.Second})
	p := newGatewayProcess(t, upstream, "idempotency {\n lease 4s\n}")
	p.start()

	// A key completed before the crash.
	resp, done, err := p.post("done-before", "finished", 10*time.Second)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("before the crash: %v %v", err, resp)
	}

	// A key in flight when the gateway dies.
	go p.post("mid-flight", "interrupted", 10*time.Second)
	waitFor(t, "the upstream call started", func() bool { return model.Stats().ByKey["mid-flight"] == 1 })
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
	waitFor(t, "the lease expired", func() bool {
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

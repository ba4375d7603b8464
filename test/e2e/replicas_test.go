package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// Several real gateway processes on one PostgreSQL database, acting as one gateway
// (docs/backends.md). The database comes from MULLIGAN_TEST_POSTGRES (./test.sh starts a
// throw-away cluster); without it these tests skip, and under CI=true they fail.

// replica is one gateway process of a replica set, with its admin endpoint.
type replica struct {
	*gatewayProcess
	admin string
}

// startReplicas starts n gateway processes in front of upstream, every one with
// `storage postgres {env.MULLIGAN_POSTGRES_URL}` naming dsn, and mulliganBody.
func startReplicas(t *testing.T, n int, upstream, dsn, mulliganBody string) []*replica {
	t.Helper()
	var out []*replica
	for range n {
		r := newReplica(t, upstream, dsn, mulliganBody)
		r.start()
		out = append(out, r)
	}
	return out
}

// newReplica prepares (but does not start) one replica of startReplicas.
func newReplica(t *testing.T, upstream, dsn, mulliganBody string) *replica {
	t.Helper()
	return newReplicaVia(t, upstream, dsn, "", mulliganBody)
}

// newReplicaVia is newReplica whose storage also names direct, the database without the
// pooler that dsn goes through (`storage postgres <dsn> { direct <dsn> }`), unless it is "".
func newReplicaVia(t *testing.T, upstream, dsn, direct, mulliganBody string) *replica {
	t.Helper()
	dataDir := t.TempDir()
	ports := testkit.FreePorts(t, 2)
	p := &gatewayProcess{t: t, dataDir: dataDir, port: ports[0], base: fmt.Sprintf("http://127.0.0.1:%d", ports[0])}
	cf := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	persist_config off
	auto_https off
	grace_period 1s
}
http://127.0.0.1:%d {
	mulligan {
		storage postgres {env.MULLIGAN_POSTGRES_URL}%s
		%s
	}
	reverse_proxy %s
}
`, ports[1], p.port, directBlock(direct), mulliganBody, strings.TrimPrefix(upstream, "http://"))
	if err := os.WriteFile(filepath.Join(dataDir, "Caddyfile"), []byte(cf), 0o644); err != nil {
		t.Fatal(err)
	}
	p.env = append(os.Environ(), "XDG_DATA_HOME="+dataDir+"/xdg-data", "XDG_CONFIG_HOME="+dataDir+"/xdg-config",
		"MULLIGAN_POSTGRES_URL="+dsn, "MULLIGAN_POSTGRES_DIRECT="+direct)
	t.Cleanup(p.cleanup)
	return &replica{gatewayProcess: p, admin: fmt.Sprintf("http://127.0.0.1:%d", ports[1])}
}

// directBlock is the storage line's block naming the direct DSN, or nothing.
func directBlock(direct string) string {
	if direct == "" {
		return ""
	}
	return " {\n\t\t\tdirect {env.MULLIGAN_POSTGRES_DIRECT}\n\t\t}"
}

// operation is the parts of an operation these tests read.
type operation struct {
	OperationID string `json:"operation_id"`
	Status      string `json:"status"`
	Done        bool   `json:"done"`
	Attempts    int    `json:"attempts"`
	Error       *struct {
		Code string `json:"code"`
	} `json:"error"`
}

// submit sends an async chat completion with key and returns its operation.
func (p *gatewayProcess) submit(t *testing.T, key string, headers ...string) operation {
	t.Helper()
	resp, body, err := p.send("POST", "/v1/chat/completions", key, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, key),
		append([]string{"Prefer", "respond-async"}, headers...)...)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit %s: %v %v %s", key, err, resp, body)
	}
	var op operation
	if err := json.Unmarshal(body, &op); err != nil {
		t.Fatal(err)
	}
	return op
}

// await polls operation id on p until it is final, for up to bound.
func (p *gatewayProcess) await(t *testing.T, id string, bound time.Duration, headers ...string) operation {
	t.Helper()
	var op operation
	testkit.WaitFor(t, bound, "operation "+id+" final", func() bool {
		resp, body, err := p.send("GET", "/v1/operations/"+id, "", "", headers...)
		op = operation{}
		return err == nil && resp.StatusCode == 200 && json.Unmarshal(body, &op) == nil && op.Done
	})
	return op
}

func TestReplicasRunAKeyOnceAndEachReplaysIt(t *testing.T) {
	t.Parallel()
	onEachPath(t, replicasRunAKeyOnce)
}

func replicasRunAKeyOnce(t *testing.T, db fleetDB) {
	model, upstream := startModelServer(t, modelserver.Config{Latency: 300 * time.Millisecond})
	rs := db.start(t, upstream, "idempotency {\n wait_inflight 15s\n}")
	const n = 90
	bodies := make([][]byte, n)
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, body, err := rs[i%len(rs)].post("one-key", "the same request", 20*time.Second)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			codes[i], bodies[i] = resp.StatusCode, body
		})
	}
	wg.Wait()
	byCode := map[int]int{}
	for i := range n {
		byCode[codes[i]]++
		if codes[i] == 200 && !bytes.Equal(bodies[i], bodies[0]) {
			t.Errorf("request %d (replica %d) got other bytes: %s", i, i%len(rs), bodies[i])
		}
	}
	for i, r := range rs { // and afterwards every replica replays it
		resp, body, err := r.post("one-key", "the same request", 10*time.Second)
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(body, bodies[0]) {
			t.Fatalf("replica %d does not replay the recorded answer: %v %v %s", i, err, resp, body)
		}
	}
	t.Logf("%d identical keyed requests over %d replicas: answers by status %v; upstream executions: %d", n, len(rs), byCode, model.Stats().ByKey["one-key"])
	if byCode[200] != n || model.Stats().ByKey["one-key"] != 1 {
		t.Fatalf("answers %v, upstream executions %d: want %d × 200 and 1 execution", byCode, model.Stats().ByKey["one-key"], n)
	}
}

func TestReplicasShareOperations(t *testing.T) {
	t.Parallel()
	onEachPath(t, replicasShareOperations)
}

func replicasShareOperations(t *testing.T, db fleetDB) {
	model, upstream := startModelServer(t, modelserver.Config{Latency: 100 * time.Millisecond})
	rs := db.start(t, upstream, "async {\n concurrency 2\n}")
	const n = 30
	ids := make([]string, n)
	for i := range n {
		ids[i] = rs[i%len(rs)].submit(t, fmt.Sprintf("shared-%d", i)).OperationID
	}
	for i, id := range ids {
		if op := rs[(i+1)%len(rs)].await(t, id, 60*time.Second); op.Status != "succeeded" {
			t.Fatalf("operation %d, polled on another replica: %s %+v", i, op.Status, op.Error)
		}
	}
	stats := model.Stats()
	t.Logf("%d operations submitted round-robin, polled on another replica: all succeeded; upstream executions %d", n, stats.Received)
	for i := range n {
		if k := fmt.Sprintf("shared-%d", i); stats.ByKey[k] != 1 {
			t.Errorf("%s ran %d times", k, stats.ByKey[k])
		}
	}
}

func TestKilledReplicasOperationsAreTakenOver(t *testing.T) {
	t.Parallel()
	onEachPath(t, killedReplicasOperationsAreTakenOver)
}

func killedReplicasOperationsAreTakenOver(t *testing.T, db fleetDB) {
	model, upstream := startModelServer(t, modelserver.Config{Latency: time.Second})
	rs := db.start(t, upstream, "async {\n concurrency 2\n takeover 3s\n}")
	const n = 30
	ids := make([]string, n)
	for i := range n {
		ids[i] = rs[0].submit(t, fmt.Sprintf("takeover-%d", i)).OperationID
	}
	// Each replica runs 2 at a time: when 2 per replica are under way, replica 0 holds two of
	// them and the rest wait in the queue.
	testkit.WaitFor(t, 15*time.Second, "every replica running", func() bool { return model.Stats().InFlight >= int64(2*len(rs)) })
	rs[0].kill()
	killedAt := time.Now()
	for i, id := range ids {
		if op := rs[1+i%(len(rs)-1)].await(t, id, 90*time.Second); op.Status != "succeeded" {
			t.Fatalf("operation %d: %s %+v", i, op.Status, op.Error)
		}
	}
	stats := model.Stats()
	reruns := countReruns(t, stats.ByKey, "takeover-", n)
	t.Logf("SIGKILL of 1 of %d replicas with %d operations: all succeeded %v after the kill; %d were re-run after the takeover (%d upstream executions, %d cut by the kill)",
		len(rs), n, time.Since(killedAt).Round(100*time.Millisecond), reruns, stats.Received, stats.Abandoned)
	if reruns == 0 {
		t.Fatal("no operation was taken over: the killed replica held none")
	}
}

func TestCancelThroughAnotherReplicaStopsTheCall(t *testing.T) {
	// Not in parallel: it bounds how soon the call stops (3 s).
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{})
	rs := startReplicas(t, 3, upstream, dsn, "")
	op := rs[0].submit(t, "to-cancel", "X-Mock-Latency", "30s")
	testkit.WaitFor(t, 15*time.Second, "the call started", func() bool { return model.Stats().InFlight == 1 })
	holder := -1
	testkit.WaitFor(t, 15*time.Second, "a replica reports it running", func() bool {
		for i, r := range rs {
			if stats := r.stats(t); stats["running"] == float64(1) {
				holder = i
				return true
			}
		}
		return false
	})
	other := rs[(holder+1)%3]
	asked := time.Now()
	resp, body, err := other.send("POST", "/v1/operations/"+op.OperationID+"/cancel", "", "")
	if err != nil || (resp.StatusCode != 200 && resp.StatusCode != 202) {
		t.Fatalf("cancel: %v %v %s", err, resp, body)
	}
	final := other.await(t, op.OperationID, 10*time.Second)
	testkit.WaitFor(t, 15*time.Second, "the upstream call ended", func() bool { return model.Stats().InFlight == 0 })
	stopped := time.Since(asked)
	t.Logf("cancel through replica %d of a call running on replica %d: answered %d, %s, upstream call cut after %v (abandoned: %d)",
		(holder+1)%3, holder, resp.StatusCode, final.Status, stopped.Round(10*time.Millisecond), model.Stats().Abandoned)
	if final.Status != "canceled" || model.Stats().Abandoned != 1 || model.Stats().Completed != 0 {
		t.Fatalf("%s; upstream stats %+v", final.Status, model.Stats())
	}
	if stopped > 3*time.Second {
		t.Fatalf("the upstream call ran on for %v after the cancel", stopped)
	}
}

// stats reads the replica's /mulligan/stats.
func (r *replica) stats(t *testing.T) map[string]any {
	t.Helper()
	resp, err := http.Get(r.admin + "/mulligan/stats")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return out
}

// courierPasses is how many times the replica's courier has looked at the outbox.
func courierPasses(t *testing.T, r *replica) float64 {
	t.Helper()
	webhooks, _ := r.stats(t)["webhooks"].(map[string]any)
	passes, _ := webhooks["passes"].(float64)
	return passes
}

func TestEventsAcrossReplicasAreDeliveredOnce(t *testing.T) {
	t.Parallel()
	onEachPath(t, eventsAcrossReplicasAreDeliveredOnce)
}

func eventsAcrossReplicasAreDeliveredOnce(t *testing.T, db fleetDB) {
	var mu sync.Mutex
	deliveries := map[string]int{}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		deliveries[r.Header.Get("webhook-id")]++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)
	_, upstream := startModelServer(t, modelserver.Config{Latency: 50 * time.Millisecond})
	hooks := fmt.Sprintf("webhooks {\n endpoint consumer %s/hook {\n secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n }\n default consumer\n allow_private\n}", receiver.URL)
	rs := db.start(t, upstream, hooks)
	const n = 30
	ids := make([]string, n)
	for i := range n {
		ids[i] = rs[i%len(rs)].submit(t, fmt.Sprintf("event-%d", i)).OperationID
	}
	for i, id := range ids {
		rs[(i+1)%len(rs)].await(t, id, 60*time.Second)
	}
	testkit.WaitFor(t, 15*time.Second, "30 events delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(deliveries) >= n
	})
	// A second delivery of any of them would be under way now, or sent by a look at the outbox
	// from now on: each replica's courier looks twice more, and has nothing under way.
	from := make([]float64, len(rs))
	for i, r := range rs {
		from[i] = courierPasses(t, r)
	}
	for i, r := range rs {
		testkit.WaitFor(t, 15*time.Second, fmt.Sprintf("replica %d's courier idle after two more passes", i), func() bool {
			webhooks, _ := r.stats(t)["webhooks"].(map[string]any)
			return courierPasses(t, r) >= from[i]+2 && webhooks["delivering"] == float64(0)
		})
	}
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for id, k := range deliveries {
		total += k
		if k != 1 {
			t.Errorf("event %s delivered %d times", id, k)
		}
	}
	t.Logf("%d operations over %d replicas: %d events, %d deliveries", n, len(rs), len(deliveries), total)
	if len(deliveries) != n {
		t.Fatalf("%d distinct events, want %d", len(deliveries), n)
	}
}

// TestReplicasRideOutAPostgresRestart stops PostgreSQL under two replicas (pg_ctl stop -m fast)
// while operations run and keyed answers are recorded, and starts it again on the same data
// directory: meanwhile the gateways answer 503 STORAGE_UNAVAILABLE (readiness too), then
// recover by themselves, and nothing they acknowledged is lost.
func TestReplicasRideOutAPostgresRestart(t *testing.T) {
	t.Parallel()
	cluster := ownCluster(t)
	model, upstream := startModelServer(t, modelserver.Config{Latency: 500 * time.Millisecond})
	rs := startReplicas(t, 2, upstream, cluster.DSN, "async {\n concurrency 4\n takeover 10s\n}")

	// Acknowledged before the outage: recorded keyed answers and accepted operations, some of
	// them running when the database goes (their outcome is written after it is back).
	recorded := map[string][]byte{}
	for i := range 6 {
		key := fmt.Sprintf("before-%d", i)
		resp, body, err := rs[i%2].post(key, key, 10*time.Second)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", key, err, resp)
		}
		recorded[key] = body
	}
	var ids []string
	for i := range 10 {
		ids = append(ids, rs[i%2].submit(t, fmt.Sprintf("op-%d", i)).OperationID)
	}
	testkit.WaitFor(t, 15*time.Second, "operations running", func() bool { return model.Stats().InFlight > 0 })
	cluster.Stop()
	downAt := time.Now()

	unavailable := 0
	for i, r := range rs {
		resp, body, err := r.post(fmt.Sprintf("during-%d", i), "during", 20*time.Second)
		if err != nil || resp.StatusCode != 503 || !bytes.Contains(body, []byte(`"STORAGE_UNAVAILABLE"`)) {
			t.Fatalf("replica %d with the database down: %v %v %s", i, err, resp, body)
		}
		unavailable++
		resp, body, err = r.send("GET", "/mulligan/healthz", "", "")
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("replica %d readiness with the database down: %v %v %s", i, err, resp, body)
		}
	}
	testkit.WaitFor(t, 15*time.Second, "the running calls finished while the database is down", func() bool { return model.Stats().InFlight == 0 })
	cluster.Start()
	upAt := time.Now()

	var recovered time.Duration
	for i, r := range rs {
		testkit.WaitFor(t, 15*time.Second, fmt.Sprintf("replica %d serving again", i), func() bool {
			resp, _, err := r.post(fmt.Sprintf("after-%d", i), "after", 10*time.Second)
			return err == nil && resp.StatusCode == 200
		})
		recovered = max(recovered, time.Since(upAt))
	}
	for key, body := range recorded {
		resp, got, err := rs[1].post(key, key, 10*time.Second)
		if err != nil || resp.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(got, body) {
			t.Fatalf("%s, recorded before the outage, does not replay: %v %v", key, err, resp)
		}
	}
	for i, id := range ids {
		if op := rs[(i+1)%2].await(t, id, 60*time.Second); op.Status != "succeeded" {
			t.Fatalf("operation %d: %s %+v", i, op.Status, op.Error)
		}
	}
	t.Logf("database down %v: %d replicas answered 503 STORAGE_UNAVAILABLE (readiness 503); serving again %v after it was back; %d recorded keys replay, %d accepted operations succeeded; %d upstream executions",
		upAt.Sub(downAt).Round(100*time.Millisecond), unavailable, recovered.Round(100*time.Millisecond), len(recorded), len(ids), model.Stats().Received)
}

// Replicas replay completed keys from memory (docs/backends.md, "Replays on PostgreSQL"); an
// eviction through one replica reaches the others' memory by NOTIFY, well within the 5 s that
// bound a lost notice.
func TestEvictionOnOneReplicaEndsReplaysOnAnother(t *testing.T) {
	// Not in parallel: it bounds how soon the eviction reaches the other replica (2 s).
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{})
	rs := startReplicas(t, 2, upstream, dsn, "")
	replayed := func(r *replica) bool {
		t.Helper()
		resp, body, err := r.post("evict-me", "the same request", 10*time.Second)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("keyed request: %v %v %s", err, resp, body)
		}
		return resp.Header.Get("Idempotent-Replayed") == "true"
	}
	if replayed(rs[0]) {
		t.Fatal("the first request was a replay")
	}
	for range 2 { // the second from replica 1's memory
		if !replayed(rs[1]) {
			t.Fatal("replica 1 does not replay the key")
		}
	}
	resp, err := http.Post(rs[0].admin+"/mulligan/keys/evict", "application/json",
		strings.NewReader(`{"scope":"","method":"POST","path":"/v1/chat/completions","key":"evict-me"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"evicted":true`) {
		t.Fatalf("evict through replica 0: %v %s", resp.Status, body)
	}
	evicted := time.Now()
	for replayed(rs[1]) {
		if time.Since(evicted) > 2*time.Second {
			t.Fatal("replica 1 still replays the key 2 s after its eviction on replica 0")
		}
	}
	t.Logf("replica 1 ran the key again %v after its eviction on replica 0", time.Since(evicted).Round(time.Millisecond))
	if n := model.Stats().ByKey["evict-me"]; n != 2 {
		t.Fatalf("upstream executions: %d, want 2 (before and after the eviction)", n)
	}
}

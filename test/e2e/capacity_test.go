package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// capacity `shared N` across replicas on one PostgreSQL (docs/capacity.md).

func TestSharedSeatsHoldAcrossReplicas(t *testing.T) {
	t.Parallel()
	onEachPath(t, sharedSeatsHoldAcrossReplicas)
}

func sharedSeatsHoldAcrossReplicas(t *testing.T, db fleetDB) {
	model, upstream := startModelServer(t, modelserver.Config{Slots: 2, Latency: 200 * time.Millisecond})
	rs := db.start(t, upstream, "capacity {\n limit 4\n shared 2\n}")
	var wg sync.WaitGroup
	for i := range 18 {
		wg.Go(func() {
			r := rs[i%len(rs)]
			resp, body, err := r.sendWithin(30*time.Second, "POST", "/v1/chat/completions", "", fmt.Sprintf(`{"messages":[{"role":"user","content":"c%d"}]}`, i))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("call %d through replica %d: %v %v %s", i, i%len(rs), err, resp, body)
			}
		})
	}
	wg.Wait()
	st := model.Stats()
	t.Logf("18 calls through %d replicas, each with limit 4 and shared 2: at most %d at once on the model server, %d queued inside it", len(rs), st.MaxInFlight, st.MaxQueued)
	if st.Completed != 18 || st.MaxInFlight > 2 || st.MaxQueued != 0 {
		t.Fatalf("model server: completed %d, at most %d in flight and %d queued; want 18, 2, 0", st.Completed, st.MaxInFlight, st.MaxQueued)
	}
}

func TestKilledReplicaGivesItsSharedSeatsBack(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{})
	rs := startReplicas(t, 2, upstream, dsn, "async {\n takeover 2s\n}\ncapacity {\n limit 4\n shared 1\n wait 20s\n}")
	go func() { // holds the one shared seat until its replica dies
		_, _, _ = rs[0].sendWithin(60*time.Second, "POST", "/v1/chat/completions", "", `{"messages":[{"role":"user","content":"held"}]}`, "X-Mock-Latency", "60s")
	}()
	testkit.WaitFor(t, 15*time.Second, "the first replica's call on the model server", func() bool { return model.Stats().InFlight == 1 })
	// While it lives, the other replica finds no shared seat.
	resp, body, err := rs[1].send("POST", "/v1/chat/completions", "", `{"messages":[{"role":"user","content":"refused"}]}`, "Prefer", "wait=1")
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || errorCode(body) != "UPSTREAM_SATURATED" {
		t.Fatalf("with the seat held by another replica: %v %v %s; want 503 UPSTREAM_SATURATED", err, resp, body)
	}
	rs[0].kill()
	killed := time.Now()
	resp, body, err = rs[1].sendWithin(30*time.Second, "POST", "/v1/chat/completions", "", `{"messages":[{"role":"user","content":"after"}]}`)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("after the holder died: %v %v %s", err, resp, body)
	}
	t.Logf("the dead replica's seat came back %v after the kill (takeover 2s)", time.Since(killed).Round(100*time.Millisecond))
}

// errorCode reads the gateway's error code from an error body.
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	return e.Error.Code
}

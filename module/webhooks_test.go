package module

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

const (
	secretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretB = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
)

// receiver is a webhook consumer on loopback: it verifies every delivery with the Standard
// Webhooks reference library, answers what answer() says, and dedupes by webhook-id.
type receiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	verifier *standardwebhooks.Webhook
	answer   func(r *http.Request) int
	attempts atomic.Int64
	seen     map[string]int // webhook-id -> deliveries accepted with 2xx
	events   []map[string]any
	badSigs  int
	sigs     []string // webhook-signature headers received
}

func newReceiver(t *testing.T, secret string, answer func(*http.Request) int) *receiver {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{verifier: wh, answer: answer, seen: map[string]int{}}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	rc.attempts.Add(1)
	body, _ := io.ReadAll(r.Body)
	status := http.StatusNoContent
	if rc.answer != nil {
		status = rc.answer(r)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.sigs = append(rc.sigs, r.Header.Get("webhook-signature"))
	if rc.verifier.Verify(body, r.Header) != nil {
		rc.badSigs++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if status < 300 {
		id := r.Header.Get("webhook-id")
		if rc.seen[id] == 0 {
			var ev map[string]any
			_ = json.Unmarshal(body, &ev)
			rc.events = append(rc.events, ev)
		}
		rc.seen[id]++
	}
	w.WriteHeader(status)
}

func (rc *receiver) delivered() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.events)
}

// newFailingReceiver is a receiver that answers status until the returned switch is turned
// off, then 200.
func newFailingReceiver(t *testing.T, status int) (*receiver, *atomic.Bool) {
	t.Helper()
	failing := new(atomic.Bool)
	failing.Store(true)
	rc := newReceiver(t, secretA, func(*http.Request) int {
		if failing.Load() {
			return status
		}
		return http.StatusOK
	})
	return rc, failing
}

func webhooksBlock(url, extra string, secrets ...string) string {
	return fmt.Sprintf("webhooks {\n endpoint hooks %s {\n secret %s\n }\n default hooks\n allow_private\n %s\n}", url, strings.Join(secrets, " "), extra)
}

func TestFinalStatusIsDeliveredSignedPerStandardWebhooks(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, secretA, nil)
	g := startHandler(t, modelserver.Config{}, webhooksBlock(rc.srv.URL+"/hook", "", secretA))
	_, op := g.submit(t, "hooked")
	final := g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 1", func() bool { return rc.delivered() == 1 })
	rc.mu.Lock()
	ev := rc.events[0]
	rc.mu.Unlock()
	operation, _ := ev["operation"].(map[string]any)
	if ev["event_type"] != "operation.succeeded" || ev["event_version"] != "1.0" || ev["delivery_attempt"] != float64(1) ||
		!strings.HasPrefix(fmt.Sprint(ev["event_id"]), "evt_") || operation["operation_id"] != op.OperationID ||
		operation["version"] != float64(final.Version) || operation["status"] != "succeeded" {
		t.Fatalf("event: %v", ev)
	}
	if rc.badSigs != 0 {
		t.Fatalf("%d deliveries failed the reference library's verification", rc.badSigs)
	}
}

func TestRotationSignsWithEverySecret(t *testing.T) {
	t.Parallel()
	rcOld := newReceiver(t, secretA, nil)
	g := startHandler(t, modelserver.Config{}, webhooksBlock(rcOld.srv.URL+"/hook", "", secretB, secretA))
	_, op := g.submit(t, "")
	g.await(t, op.OperationID)
	// The receiver knows only the old secret, and verifies.
	testkit.WaitFor(t, 5*time.Second, "rcOld.delivered() == 1", func() bool { return rcOld.delivered() == 1 })
	rcOld.mu.Lock()
	defer rcOld.mu.Unlock()
	if n := len(strings.Fields(rcOld.sigs[0])); n != 2 {
		t.Fatalf("%d signatures for two secrets: %q", n, rcOld.sigs[0])
	}
}

func TestCallbackUrlOutsideTheEndpointsIsRefusedBeforeAnything(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, secretA, nil)
	g := startHandler(t, modelserver.Config{}, "webhooks {\n endpoint hooks "+rc.srv.URL+"/hooks/* {\n secret "+secretA+"\n }\n allow_private\n}")
	for _, url := range []string{"https://evil.example.com/hooks/x", rc.srv.URL + "/other", rc.srv.URL + "/hooks/../admin", "not a url"} {
		r := g.post(chatPath, "", chat("x"), "Prefer", "respond-async", "Callback-Url", url)
		expectError(t, r, 422, apierr.CodeCallbackNotAllow, false)
	}
	if n := g.model.Stats().Received; n != 0 {
		t.Fatalf("a refused request reached the upstream %d times", n)
	}
	r := g.post(chatPath, "", chat("x"), "Prefer", "respond-async", "Callback-Url", rc.srv.URL+"/hooks/job-7")
	g.await(t, decodeOp(t, r).OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 1", func() bool { return rc.delivered() == 1 })
}

func TestGoneDisablesTheEndpointUntilReenabled(t *testing.T) {
	rc, gone := newFailingReceiver(t, http.StatusGone)
	g := startGateway(t, modelserver.Config{}, webhooksBlock(rc.srv.URL+"/hook", "", secretA))
	_, op := g.submit(t, "")
	g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.attempts.Load() == 1", func() bool { return rc.attempts.Load() == 1 })
	// The receiver sees the attempt a moment before the courier records the 410.
	testkit.WaitFor(t, 5*time.Second, "strings.Contains(g.adminCall(\"GET\", \"/mulligan/stats\"), `\"disabled\":true`)", func() bool { return strings.Contains(g.adminCall("GET", "/mulligan/stats"), `"disabled":true`) })
	gone.Store(false)
	g.adminCall("POST", "/mulligan/endpoints/hooks/enable")
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 1", func() bool { return rc.delivered() == 1 })
}

func TestRedirectIsAFailureAndIsNotFollowed(t *testing.T) {
	var followed atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { followed.Add(1) }))
	defer target.Close()
	rc := newReceiver(t, secretA, func(r *http.Request) int { return http.StatusFound })
	g := startGateway(t, modelserver.Config{}, webhooksBlock(rc.srv.URL+"/hook", "max_attempts 2\n backoff 10ms 20ms", secretA))
	_, op := g.submit(t, "")
	g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, `strings.Contains(g.adminCall("GET", "/mulligan/dead-letters"), op.OperationID)`, func() bool { return strings.Contains(g.adminCall("GET", "/mulligan/dead-letters"), op.OperationID) })
	if followed.Load() != 0 || rc.attempts.Load() != 2 {
		t.Fatalf("redirect followed %d times; %d attempts", followed.Load(), rc.attempts.Load())
	}
}

func TestRefusedEventIsDeadLetteredAndRedelivered(t *testing.T) {
	rc, refuse := newFailingReceiver(t, http.StatusBadRequest)
	g := startGateway(t, modelserver.Config{}, webhooksBlock(rc.srv.URL+"/hook", "", secretA))
	_, op := g.submit(t, "")
	g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, `strings.Contains(g.adminCall("GET", "/mulligan/dead-letters"), op.OperationID)`, func() bool { return strings.Contains(g.adminCall("GET", "/mulligan/dead-letters"), op.OperationID) })
	if rc.attempts.Load() != 1 {
		t.Fatalf("a 400 was retried: %d attempts", rc.attempts.Load())
	}
	refuse.Store(false)
	g.adminCall("POST", "/mulligan/dead-letters/redeliver")
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 1", func() bool { return rc.delivered() == 1 })
	if strings.Contains(g.adminCall("GET", "/mulligan/dead-letters"), op.OperationID) {
		t.Fatal("still a dead letter after redelivery")
	}
}

func TestPrivateTargetsAreRefusedWithoutAllowPrivate(t *testing.T) {
	rc := newReceiver(t, secretA, nil)
	port := rc.srv.URL[strings.LastIndex(rc.srv.URL, ":")+1:]
	for _, host := range []string{"127.0.0.1", "localhost"} {
		t.Run(host, func(t *testing.T) {
			url := "http://" + host + ":" + port + "/hook"
			g := startGateway(t, modelserver.Config{}, "webhooks {\n endpoint hooks "+url+" {\n secret "+secretA+"\n }\n default hooks\n}")
			_, op := g.submit(t, "")
			g.await(t, op.OperationID)
			testkit.WaitFor(t, 5*time.Second, `strings.Contains(g.adminCall("GET", "/mulligan/dead-letters"), op.OperationID)`, func() bool { return strings.Contains(g.adminCall("GET", "/mulligan/dead-letters"), op.OperationID) })
			if !strings.Contains(g.adminCall("GET", "/mulligan/dead-letters"), "SSRF") {
				t.Fatalf("dead letter without the SSRF reason: %s", g.adminCall("GET", "/mulligan/dead-letters"))
			}
		})
	}
	if rc.attempts.Load() != 0 {
		t.Fatalf("the private receiver got %d requests", rc.attempts.Load())
	}
}

// TestFlakyReceiverWithAnOutageGetsEveryEventOnce: 300 operations; the receiver fails half its
// requests at random and is down for 2 s in the middle. Every event is delivered, each seen
// once after dedupe, and the breaker bounds what is sent while it is down.
func TestFlakyReceiverWithAnOutageGetsEveryEventOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("takes about 10s")
	}
	const (
		n        = 300
		outage   = 2 * time.Second
		cooldown = 250 * time.Millisecond
		failures = 5
		inFlight = 16 // the deliveries of one endpoint under way at once
	)
	var down atomic.Bool
	var whileDown atomic.Int64
	rc := newReceiver(t, secretA, func(*http.Request) int {
		if down.Load() {
			whileDown.Add(1)
			return http.StatusServiceUnavailable
		}
		if rand.IntN(2) == 0 {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	breaker := fmt.Sprintf("breaker %d %s\n backoff 50ms 500ms\n max_attempts 100", failures, cooldown)
	g := startHandler(t, modelserver.Config{}, webhooksBlock(rc.srv.URL+"/hook", breaker, secretA)+"\nasync {\n concurrency 8\n}")
	for i := range n {
		g.submit(t, fmt.Sprintf("flaky-%d", i))
		if i == n/2 {
			down.Store(true)
			time.AfterFunc(outage, func() { down.Store(false) })
		}
	}
	testkit.WaitFor(t, 90*time.Second, "every event delivered", func() bool { return rc.delivered() >= n })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	dupes := 0
	for _, c := range rc.seen {
		dupes += c - 1
	}
	t.Logf("delivered %d distinct events of %d in %d attempts (%d duplicates deduped by webhook-id); %d attempts reached the receiver during its %s outage",
		len(rc.events), n, rc.attempts.Load(), dupes, whileDown.Load(), outage)
	if len(rc.events) != n || rc.badSigs != 0 || dupes != 0 {
		t.Fatalf("delivered %d of %d, %d bad signatures, %d acknowledged twice", len(rc.events), n, rc.badSigs, dupes)
	}
	// Open after `failures` failures, one probe per cooldown, plus the deliveries already under
	// way when it went down; twice that leaves room for a loaded machine, and without the breaker
	// every event waiting would be tried (150 and more).
	if most := 2 * (failures + int64(outage/cooldown) + inFlight); whileDown.Load() > most {
		t.Fatalf("%d attempts during the outage, more than %d: the breaker did not hold them back", whileDown.Load(), most)
	}
}

// adminCall calls Caddy's admin API and returns the body.
func (g *gateway) adminCall(method, path string) string {
	g.t.Helper()
	req, _ := http.NewRequest(method, "http://"+g.admin+path, nil)
	resp, err := adminClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		g.t.Fatalf("admin %s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return string(b)
}

func TestRunningEventsAreDeliveredWhenAskedFor(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, secretA, nil)
	g := startHandler(t, modelserver.Config{}, webhooksBlock(rc.srv.URL+"/hook", "events operation.running operation.succeeded", secretA))
	_, op := g.submit(t, "")
	g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 2", func() bool { return rc.delivered() == 2 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	versions := map[string]float64{}
	for _, ev := range rc.events {
		versions[fmt.Sprint(ev["event_type"])] = ev["operation"].(map[string]any)["version"].(float64)
	}
	if versions["operation.running"] != 2 || versions["operation.succeeded"] != 3 {
		t.Fatalf("events and versions: %v", versions)
	}
}

package consumer

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/mulligan-gw/mulligan/webhook"
)

func TestSignedDeliveryIsProcessedOnce(t *testing.T) {
	h := start(t, t.TempDir(), Config{})
	if got := h.deliver("evt_1", event("evt_1", "op_1", "succeeded", 3)); got != http.StatusOK {
		t.Fatalf("status %d, want 200", got)
	}
	h.waitIdle()

	events := h.processed.all()
	if len(events) != 1 {
		t.Fatalf("processed %d events, want 1", len(events))
	}
	ev := events[0]
	if ev.EventID != "evt_1" || ev.EventType != EventOperationSucceeded || ev.Refreshed {
		t.Errorf("event = %+v", ev)
	}
	op := ev.Operation
	if op.OperationID != "op_1" || op.Status != "succeeded" || !op.Done || op.Version != 3 ||
		op.Response == nil || string(op.Response.Body) != `{"id":"chatcmpl-1"}` || op.Links.Self != "/v1/operations/op_1" {
		t.Errorf("operation = %+v", op)
	}
}

func TestSameWebhookIDDeliveredThreeTimesIsProcessedOnce(t *testing.T) {
	dir := t.TempDir()
	h := start(t, dir, Config{})
	body := event("evt_1", "op_1", "succeeded", 3)
	var wg sync.WaitGroup
	statuses := make([]int, 3)
	for i := range statuses {
		wg.Go(func() { statuses[i] = h.deliver("evt_1", body) })
	}
	wg.Wait()
	h.waitIdle()

	for i, status := range statuses {
		if status != http.StatusOK {
			t.Errorf("delivery %d: status %d, want 200", i+1, status)
		}
	}
	if got := len(h.processed.all()); got != 1 {
		t.Errorf("processed %d times, want 1", got)
	}
	if got := journaledIDs(t, dir); !slices.Equal(got, []string{"evt_1"}) {
		t.Errorf("journaled %v, want [evt_1]: duplicates are recognised by webhook-id", got)
	}
}

func TestRedeliveryAfterRestartIsStillDeduplicated(t *testing.T) {
	dir := t.TempDir()
	body := event("evt_1", "op_1", "succeeded", 3)
	first := start(t, dir, Config{})
	first.deliver("evt_1", body)
	first.waitIdle()
	first.stop()

	second := start(t, dir, Config{})
	if got := second.deliver("evt_1", body); got != http.StatusOK {
		t.Fatalf("redelivery: status %d, want 200", got)
	}
	second.waitIdle()
	if got := len(second.processed.all()); got != 0 {
		t.Errorf("redelivery processed %d times after the restart, want 0", got)
	}
	if got := journaledIDs(t, dir); !slices.Equal(got, []string{"evt_1"}) {
		t.Errorf("journaled %v, want [evt_1]: the restart forgot the id", got)
	}
}

func TestEventJournaledButNotProcessedBeforeCloseIsProcessedAfterRestart(t *testing.T) {
	dir := t.TempDir()
	inProcess, release := make(chan struct{}), make(chan struct{})
	first := start(t, dir, Config{Process: func(ev Event) {
		if ev.EventID != "evt_1" {
			t.Errorf("%s processed before Close, want it left for the restart", ev.EventID)
			return
		}
		close(inProcess)
		<-release
	}})
	first.deliver("evt_1", event("evt_1", "op_1", "succeeded", 3))
	<-inProcess
	if got := first.deliver("evt_2", event("evt_2", "op_2", "succeeded", 3)); got != http.StatusOK {
		t.Fatalf("evt_2: status %d, want 200", got)
	}
	closed := make(chan struct{})
	go func() { first.stop(); close(closed) }()
	<-first.consumer.stop.Done() // Close has begun: evt_2 must now wait for the next start
	close(release)
	<-closed

	second := start(t, dir, Config{})
	second.waitIdle()
	if got := versionsOf(second.processed.all()); !slices.Equal(got, []string{"op_2@3"}) {
		t.Errorf("processed after the restart: %v, want [op_2@3]", got)
	}
}

func TestBadSignatureIsRefusedAndNotJournaled(t *testing.T) {
	body := event("evt_1", "op_1", "succeeded", 3)
	other := []webhook.Secret{testSecret(t, "x")}
	cases := map[string]func(h *harness) int{
		"wrong secret": func(h *harness) int {
			return h.deliverSigned("evt_1", body, webhook.Sign(other, "evt_1", testNow, body))
		},
		"tampered body": func(h *harness) int {
			return h.deliverSigned("evt_1", append(body, ' '), webhook.Sign(h.secrets, "evt_1", testNow, body))
		},
		"other id": func(h *harness) int {
			return h.deliverSigned("evt_1", body, webhook.Sign(h.secrets, "evt_2", testNow, body))
		},
		"no signature":   func(h *harness) int { return h.deliverSigned("evt_1", body, "") },
		"garbage header": func(h *harness) int { return h.deliverSigned("evt_1", body, "v1,not-base64") },
	}
	for name, send := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			h := start(t, dir, Config{})
			if got := send(h); got != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", got)
			}
			if data, _ := os.ReadFile(filepath.Join(dir, journalFile)); len(data) != 0 {
				t.Fatalf("journal holds %q, want nothing", data)
			}
			// Not remembered either: the genuine delivery of the id is processed.
			h.deliver("evt_1", body)
			h.waitIdle()
			if got := len(h.processed.all()); got != 1 {
				t.Errorf("genuine delivery processed %d times, want 1", got)
			}
		})
	}
}

func TestRotationAcceptsEventSignedWithOldAndNewSecret(t *testing.T) {
	oldSecret, newSecret := testSecret(t, "o"), testSecret(t, "n")
	h := start(t, t.TempDir(), Config{Secrets: []webhook.Secret{newSecret}})
	body := event("evt_1", "op_1", "succeeded", 3)
	signature := webhook.Sign([]webhook.Secret{oldSecret, newSecret}, "evt_1", testNow, body)
	if got := h.deliverSigned("evt_1", body, signature); got != http.StatusOK {
		t.Fatalf("status %d, want 200", got)
	}
	h.waitIdle()
	if got := len(h.processed.all()); got != 1 {
		t.Errorf("processed %d events, want 1", got)
	}
}

func TestStaleVersionIsIgnored(t *testing.T) {
	h := start(t, t.TempDir(), Config{})
	h.deliver("evt_3", event("evt_3", "op_1", "succeeded", 3))
	h.deliver("evt_2", event("evt_2", "op_1", "running", 2))         // older, arrived late
	h.deliver("evt_3b", event("evt_3b", "op_1", "succeeded", 3))     // same version, another event
	h.deliver("evt_other", event("evt_other", "op_2", "running", 2)) // another operation
	h.waitIdle()
	if got := versionsOf(h.processed.all()); !slices.Equal(got, []string{"op_1@3", "op_2@2"}) {
		t.Errorf("processed %v, want [op_1@3 op_2@2]", got)
	}
}

func TestVersionsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	first := start(t, dir, Config{})
	first.deliver("evt_3", event("evt_3", "op_1", "succeeded", 3))
	first.waitIdle()
	first.stop()

	second := start(t, dir, Config{})
	second.deliver("evt_2", event("evt_2", "op_1", "running", 2))
	second.waitIdle()
	if got := len(second.processed.all()); got != 0 {
		t.Errorf("a stale event was processed after the restart: %v", versionsOf(second.processed.all()))
	}
}

// gatewayStub stands in for the gateway's GET {operations}/{id}.
type gatewayStub struct {
	mu       sync.Mutex
	requests []*http.Request
	answer   func(w http.ResponseWriter)
}

func (g *gatewayStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.requests = append(g.requests, r)
	g.mu.Unlock()
	g.answer(w)
}

func (g *gatewayStub) polls() []*http.Request {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.requests)
}

func startGateway(t *testing.T, answer func(w http.ResponseWriter)) (*gatewayStub, Config) {
	stub := &gatewayStub{answer: answer}
	srv := httptest.NewServer(stub)
	t.Cleanup(srv.Close)
	return stub, Config{Gateway: srv.URL, Client: srv.Client(), PollHeader: http.Header{"Authorization": {"Bearer tenant-a"}}}
}

func TestVersionGapPollsTheGateway(t *testing.T) {
	succeeded := event("evt_6", "op_1", "succeeded", 6)
	gateway, cfg := startGateway(t, func(w http.ResponseWriter) {
		var ev struct{ Operation json.RawMessage }
		_ = json.Unmarshal(succeeded, &ev)
		w.Write(ev.Operation)
	})
	h := start(t, t.TempDir(), cfg)
	h.deliver("evt_2", event("evt_2", "op_1", "running", 2))
	h.deliver("evt_5", event("evt_5", "op_1", "running", 5)) // versions 3 and 4 were missed
	h.deliver("evt_6", succeeded)                            // the state the poll already processed
	h.waitIdle()

	polls := gateway.polls()
	if len(polls) != 1 || polls[0].URL.Path != "/v1/operations/op_1" || polls[0].Header.Get("Authorization") != "Bearer tenant-a" {
		t.Fatalf("polls = %v, want one GET /v1/operations/op_1 with the Authorization", polls)
	}
	events := h.processed.all()
	if got := versionsOf(events); !slices.Equal(got, []string{"op_1@2", "op_1@6"}) {
		t.Fatalf("processed %v, want [op_1@2 op_1@6]", got)
	}
	if last := events[1]; !last.Refreshed || last.EventID != "evt_5" || last.Operation.Status != "succeeded" {
		t.Errorf("refreshed event = %+v", last)
	}
}

func TestFailingPollProcessesTheEventAsDelivered(t *testing.T) {
	gateway, cfg := startGateway(t, func(w http.ResponseWriter) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	})
	h := start(t, t.TempDir(), cfg)
	h.deliver("evt_2", event("evt_2", "op_1", "running", 2))
	h.deliver("evt_5", event("evt_5", "op_1", "running", 5))
	h.waitIdle()

	if got := len(gateway.polls()); got != 1 {
		t.Errorf("%d polls, want 1", got)
	}
	events := h.processed.all()
	if got := versionsOf(events); !slices.Equal(got, []string{"op_1@2", "op_1@5"}) || events[1].Refreshed {
		t.Errorf("processed %v (refreshed %v), want [op_1@2 op_1@5] as delivered", got, events[len(events)-1].Refreshed)
	}
}

func TestFinalEventAfterAGapIsTrustedWithoutPolling(t *testing.T) {
	gateway, cfg := startGateway(t, func(w http.ResponseWriter) { http.Error(w, "unexpected", http.StatusTeapot) })
	h := start(t, t.TempDir(), cfg)
	h.deliver("evt_2", event("evt_2", "op_1", "running", 2))
	h.deliver("evt_4", event("evt_4", "op_1", "canceled", 4))
	h.waitIdle()

	if got := len(gateway.polls()); got != 0 {
		t.Errorf("%d polls, want 0: a final state is never superseded", got)
	}
	if got := versionsOf(h.processed.all()); !slices.Equal(got, []string{"op_1@2", "op_1@4"}) {
		t.Errorf("processed %v, want [op_1@2 op_1@4]", got)
	}
}

func TestRefusedRequests(t *testing.T) {
	h := start(t, t.TempDir(), Config{MaxBodyBytes: 1024})
	large := event("evt_big", "op_1", "succeeded", 3)
	large = append(large[:len(large)-1], []byte(`,"padding":"`+strings.Repeat("x", 2048)+`"}`)...)
	notAnEvent := []byte(`{"hello":"world"}`)

	if got := h.deliver("evt_big", large); got != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: status %d, want 413", got)
	}
	if got := h.deliver("evt_bad", notAnEvent); got != http.StatusBadRequest {
		t.Errorf("signed body that is not an event: status %d, want 400", got)
	}
	resp, err := h.server.Client().Get(h.server.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d, want 405", resp.StatusCode)
	}
	h.waitIdle()
	if got := len(h.processed.all()); got != 0 {
		t.Errorf("processed %d events, want 0", got)
	}
}

func TestEitherSignatureStyleIsAcceptedAndDedupedByItsID(t *testing.T) {
	raw, err := webhook.RawSecret("seed-secret")
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, t.TempDir(), Config{XWebhookSecrets: []webhook.Secret{raw}})
	if got := h.deliverX("evt_x", event("evt_x", "op_1", "succeeded", 3), []webhook.Secret{raw}); got != http.StatusOK {
		t.Fatalf("x-webhook delivery: status %d, want 200", got)
	}
	if got := h.deliverX("evt_x", event("evt_x", "op_1", "succeeded", 3), []webhook.Secret{raw}); got != http.StatusOK {
		t.Fatalf("x-webhook redelivery: status %d, want 200", got)
	}
	if got := h.deliver("evt_s", event("evt_s", "op_2", "succeeded", 3)); got != http.StatusOK {
		t.Fatalf("standard delivery: status %d, want 200", got)
	}
	h.waitIdle()
	if got := versionsOf(h.processed.all()); !slices.Equal(got, []string{"op_1@3", "op_2@3"}) {
		t.Errorf("processed %v, want [op_1@3 op_2@3]: each once", got)
	}
	if ids := journaledIDs(t, h.consumer.cfg.Dir); !slices.Equal(ids, []string{"evt_x", "evt_s"}) {
		t.Errorf("journaled %v, want [evt_x evt_s]", ids)
	}
}

func TestXWebhookDeliveryWithABadSignatureIsRefused(t *testing.T) {
	raw, _ := webhook.RawSecret("seed-secret")
	other, _ := webhook.RawSecret("other")
	body := event("evt_x", "op_1", "succeeded", 3)
	for name, secrets := range map[string][]webhook.Secret{
		"wrong secret":                       {other},
		"the whsec secret used as a raw one": {testSecret(t, "c")},
	} {
		t.Run(name, func(t *testing.T) {
			h := start(t, t.TempDir(), Config{XWebhookSecrets: []webhook.Secret{raw}})
			if got := h.deliverX("evt_x", body, secrets); got != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", got)
			}
		})
	}
}

// A Responses API event (OpenAI's format) is acknowledged once verified, and not taken for an
// operation event.
func TestResponseEventIsAcknowledged(t *testing.T) {
	h := start(t, t.TempDir(), Config{})
	body := []byte(`{"id":"evt_9","object":"event","type":"response.completed","created_at":1,"data":{"id":"resp_1"}}`)
	if got := h.deliver("evt_9", body); got != http.StatusOK {
		t.Fatalf("status %d, want 200", got)
	}
	h.waitIdle()
	if n := len(h.processed.all()); n != 0 {
		t.Fatalf("processed %d operation events, want none", n)
	}
	if got := h.deliverSigned("evt_10", body, "v1,bad"); got != http.StatusUnauthorized {
		t.Fatalf("a bad signature answered %d, want 401", got)
	}
}

package module

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/webhook"
)

// TestDefaultWebhookScheduleSpansADay: with no schedule settings an event gets 8 attempts whose
// waits, even at their shortest, add up to more than a day (it was 10 attempts over 10 to 20
// minutes).
func TestDefaultWebhookScheduleSpansADay(t *testing.T) {
	var c WebhooksConfig
	c.setDefaults()
	h, err := newWebhookSetup(&c, caddy.NewReplacer())
	if err != nil {
		t.Fatal(err)
	}
	var span time.Duration
	for retry := range c.MaxAttempts - 1 {
		span += h.RetryWait(retry, 0)
	}
	if c.MaxAttempts != 8 || span < 27*time.Hour+35*time.Minute {
		t.Fatalf("%d attempts over %v; want 8 over at least 27h35m", c.MaxAttempts, span)
	}
	if time.Duration(c.MaxAge) < span {
		t.Fatalf("max_age %v is shorter than the schedule's %v", time.Duration(c.MaxAge), span)
	}
	t.Logf("default: %d attempts spanning %v", c.MaxAttempts, span)
}

// xReceiver is a consumer of the seed's X-Webhook style on loopback: it verifies every delivery
// with webhook.VerifyXWebhook and keeps what it accepted.
type xReceiver struct {
	srv     *httptest.Server
	secrets []webhook.Secret
	mu      sync.Mutex
	got     []http.Header
	events  []map[string]any
	badSigs []error
}

func newXReceiver(t *testing.T, secrets ...string) *xReceiver {
	rc := &xReceiver{}
	for _, s := range secrets {
		secret, err := webhook.RawSecret(s)
		if err != nil {
			t.Fatal(err)
		}
		rc.secrets = append(rc.secrets, secret)
	}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.got = append(rc.got, r.Header.Clone())
		if err := webhook.VerifyXWebhook(rc.secrets, r.Header, body, time.Now()); err != nil {
			rc.badSigs = append(rc.badSigs, err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev map[string]any
		_ = json.Unmarshal(body, &ev)
		rc.events = append(rc.events, ev)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *xReceiver) delivered() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.events)
}

func TestXWebhookEndpointIsSignedInTheSeedsStyle(t *testing.T) {
	rc := newXReceiver(t, "old-seed-secret") // the consumer still knows only the old secret
	g := startGateway(t, modelserver.Config{}, fmt.Sprintf(
		"webhooks {\n endpoint seed %s/hook {\n secret new-seed-secret old-seed-secret\n signature x-webhook\n }\n default seed\n allow_private\n}", rc.srv.URL))
	_, op := g.submit(t, "x-style")
	g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 1", func() bool { return rc.delivered() == 1 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	h, ev := rc.got[0], rc.events[0]
	if len(rc.badSigs) != 0 {
		t.Fatalf("deliveries that did not verify: %v", rc.badSigs)
	}
	if h.Get("X-Webhook-Id") != ev["event_id"] || h.Get("X-Event-Type") != "operation.succeeded" || ev["event_type"] != "operation.succeeded" {
		t.Fatalf("X-Webhook-Id %q, X-Event-Type %q for event %v", h.Get("X-Webhook-Id"), h.Get("X-Event-Type"), ev)
	}
	if ts, err := time.Parse(time.RFC3339, h.Get("X-Webhook-Timestamp")); err != nil || !strings.HasSuffix(h.Get("X-Webhook-Timestamp"), "Z") || time.Since(ts) > time.Minute {
		t.Fatalf("X-Webhook-Timestamp %q is not a recent RFC 3339 UTC time", h.Get("X-Webhook-Timestamp"))
	}
	if sig := h.Get("X-Webhook-Signature"); strings.Count(sig, ",v1=") != 2 || !strings.HasPrefix(sig, "t="+h.Get("X-Webhook-Timestamp")+",") {
		t.Fatalf("X-Webhook-Signature %q, want t=<timestamp> and one v1= per secret", sig)
	}
	if h.Get("webhook-signature") != "" {
		t.Fatalf("an x-webhook delivery carries webhook-signature too")
	}
}

func TestStandardWebhooksDeliveryCarriesTheEventType(t *testing.T) {
	var mu sync.Mutex
	var types []string
	rc := newReceiver(t, secretA, func(r *http.Request) int {
		mu.Lock()
		defer mu.Unlock()
		types = append(types, r.Header.Get("X-Event-Type"))
		return http.StatusNoContent
	})
	g := startGateway(t, modelserver.Config{}, webhooksBlock(rc.srv.URL+"/hook", "events operation.running operation.succeeded", secretA))
	_, op := g.submit(t, "")
	g.await(t, op.OperationID)
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 2", func() bool { return rc.delivered() == 2 })
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(types) // the two events may arrive in either order
	if strings.Join(types, " ") != "operation.running operation.succeeded" {
		t.Fatalf("X-Event-Type of the deliveries: %q", types)
	}
}

// delivery is one webhook attempt a receiver saw: when, on the test's clock, and the event.
type delivery struct {
	at      time.Time
	eventID string
}

// TestDefaultScheduleSpacesEightAttemptsThenDeadLetters: an event whose receiver keeps
// answering 503 is tried 8 times, each retry due its default-schedule wait after the failure
// (5s, 5m, 30m, 2h, 5h, 10h, 10h, each lengthened by at most 20%) and delivered when due on the
// courier's clock; then it is dead-lettered. The breaker is set past 8 failures: it keeps
// time on gobreaker's wall clock, which the test's clock does not move.
func TestDefaultScheduleSpacesEightAttemptsThenDeadLetters(t *testing.T) {
	clock := newFakeClock()
	deliveries := make(chan delivery, 16)
	rc := newReceiver(t, secretA, func(r *http.Request) int {
		deliveries <- delivery{at: clock.Now(), eventID: r.Header.Get("webhook-id")}
		return http.StatusServiceUnavailable
	})
	url := rc.srv.URL + "/hook"
	lr := newLoopRunner(t, clock, answerOK, 0, testEndpoint(t, "hooks", url))
	lr.Accept(t, "op_1", testExecution(time.Minute, 3), &store.Callback{Endpoint: "hooks", URL: url}, chat("announced"))
	lr.ClaimNext()
	d := awaitDelivery(t, clock, deliveries, "the first attempt")
	start := d.at
	for retry, wait := range webhook.DefaultSchedule {
		ev := testkit.AwaitEvent(t, lr.st, d.eventID, "attempt recorded", func(ev *store.Event) bool { return ev.Attempts == retry+1 })
		if gap := ev.NextAttempt.Sub(d.at); ev.State != store.EventPending || gap < wait || gap > wait+wait/5 {
			t.Fatalf("after attempt %d: %s, due %v later; want pending, due in [%v, %v]", retry+1, ev.State, gap, wait, wait+wait/5)
		}
		clock.Advance(clock.Until(ev.NextAttempt))
		d = awaitDelivery(t, clock, deliveries, fmt.Sprintf("attempt %d when due", retry+2))
		if late := d.at.Sub(ev.NextAttempt); late < 0 || late > time.Second {
			t.Fatalf("attempt %d came %v after it was due, want within [0, 1s]", retry+2, late)
		}
	}
	ev := testkit.AwaitEvent(t, lr.st, d.eventID, "dead-lettered", func(ev *store.Event) bool { return ev.State == store.EventDead })
	if ev.Attempts != 8 || ev.DeadReason != "max_attempts reached" {
		t.Fatalf("dead letter after %d attempts, %q; want 8, max_attempts reached", ev.Attempts, ev.DeadReason)
	}
	t.Logf("8 attempts over %v on the clock", d.at.Sub(start))
}

// awaitDelivery waits for the next attempt, moving the clock on a little while it waits: the
// courier's pass may have read the time just before the test advanced it.
func awaitDelivery(t *testing.T, clock *clockwork.FakeClock, deliveries <-chan delivery, what string) delivery {
	t.Helper()
	var d delivery
	testkit.WaitFor(t, 10*time.Second, what, func() bool {
		select {
		case d = <-deliveries:
			return true
		default:
			clock.Advance(10 * time.Millisecond)
			return false
		}
	})
	return d
}

// answerOK is an upstream that answers every attempt 200.
var answerOK = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"ok":true}`)) })

// testEndpoint is a block's webhooks declaring one endpoint, name, at url, signed with secretA,
// on the default schedule. Its breaker opens only past 100 failures: it keeps time on
// gobreaker's wall clock, which a test's fake clock does not move.
func testEndpoint(t *testing.T, name, url string) map[string]*webhookSetup {
	t.Helper()
	cfg := WebhooksConfig{Endpoints: []EndpointConfig{{Name: name, URL: url, Secrets: []string{secretA}}},
		Default: name, AllowPrivate: true, BreakerFailures: 100}
	cfg.setDefaults()
	h, err := newWebhookSetup(&cfg, caddy.NewReplacer())
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*webhookSetup{name: h}
}

// TestEventOfAnEndpointMissingFromTheConfigWaitsForIt: in a rolling deploy a replica may not yet
// (or no longer) declare an endpoint that others do; it must leave that endpoint's events to
// them, uncharged, not dead-letter them. Each courier pass over the due event puts it off a
// minute: five such passes, an hour apart on the clock, leave it pending with its one attempt,
// unsent; a config declaring the endpoint again gets it delivered at once.
func TestEventOfAnEndpointMissingFromTheConfigWaitsForIt(t *testing.T) {
	clock := newFakeClock()
	rc, deliveries, failing := failingReceiver(t, clock, http.StatusServiceUnavailable)
	url := rc.srv.URL + "/hook"
	hooks := testEndpoint(t, "hooks", url)
	lr := newLoopRunner(t, clock, answerOK, 0, hooks)
	lr.Accept(t, "op_1", testExecution(time.Minute, 3), &store.Callback{Endpoint: "hooks", URL: url}, chat("rolling"))
	lr.ClaimNext()
	d := awaitDelivery(t, clock, deliveries, "the first attempt")
	ev := testkit.AwaitEvent(t, lr.st, d.eventID, "the 503 recorded", func(ev *store.Event) bool { return ev.Attempts == 1 })
	lr.endpoints(testEndpoint(t, "other", rc.srv.URL+"/other"))
	for pass := range 5 {
		clock.Advance(clock.Until(ev.NextAttempt) + time.Hour)
		due := ev.NextAttempt
		// The courier may set its timer just after the clock moved, from the time before: the
		// clock moves on a minute at each look until a pass has come.
		ev = testkit.AwaitEvent(t, lr.st, d.eventID, fmt.Sprintf("courier pass %d over the due event", pass+1),
			func(ev *store.Event) bool {
				if ev.NextAttempt.After(due) || ev.State != store.EventPending {
					return true
				}
				clock.Advance(time.Minute)
				return false
			})
		if ev.State != store.EventPending || ev.Attempts != 1 {
			t.Fatalf("pass %d with the endpoint missing: %s after %d attempts, want pending after 1", pass+1, ev.State, ev.Attempts)
		}
	}
	select {
	case d := <-deliveries:
		t.Fatalf("sent at %v while its endpoint was missing from the config", d.at)
	default:
	}
	failing.Store(false)
	lr.endpoints(hooks)
	awaitDelivery(t, clock, deliveries, "the delivery once the endpoint is declared again")
	testkit.AwaitEvent(t, lr.st, d.eventID, "delivered", func(ev *store.Event) bool { return ev.State == store.EventDelivered })
}

// failingReceiver is a receiver that answers status while failing is set (it starts set), and
// 200 once the test clears it; each delivery is reported, when on the clock and of which event.
func failingReceiver(t *testing.T, clock clockwork.Clock, status int) (rc *receiver, deliveries <-chan delivery, failing *atomic.Bool) {
	failing = new(atomic.Bool)
	failing.Store(true)
	ch := make(chan delivery, 16)
	rc = newReceiver(t, secretA, func(r *http.Request) int {
		ch <- delivery{at: clock.Now(), eventID: r.Header.Get("webhook-id")}
		if failing.Load() {
			return status
		}
		return http.StatusOK
	})
	return rc, ch, failing
}

package webhook_test

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/webhook"
)

// Encoded test secrets: 32 bytes each, as "whsec_" + base64.
var (
	currentSecretText = "whsec_" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("c", 32)))
	oldSecretText     = "whsec_" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("o", 32)))
	otherSecretText   = "whsec_" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("x", 32)))
)

func mustSecret(t testing.TB, s string) webhook.Secret {
	t.Helper()
	secret, err := webhook.ParseSecret(s)
	if err != nil {
		t.Fatalf("ParseSecret(%q): %v", s, err)
	}
	return secret
}

// fakeClock advances by step every time it is read, so consecutive attempts
// get distinct webhook-timestamps without sleeping.
type fakeClock struct {
	mu   sync.Mutex
	now  time.Time
	step time.Duration
}

func newFakeClock(step time.Duration) *fakeClock {
	return &fakeClock{now: time.Unix(1_780_827_373, 0), step: step}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.now
	c.now = c.now.Add(c.step)
	return t
}

// received is one request as the receiver saw it.
type received struct {
	header http.Header
	body   []byte
}

// receiver is a loopback webhook consumer that records every request and
// answers the n-th (1-based) with answer.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []received
	answer func(n int, w http.ResponseWriter, r *http.Request)
}

func newReceiver(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *receiver {
	t.Helper()
	rc := &receiver{answer: answer}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, received{header: r.Header.Clone(), body: body})
		n := len(rc.got)
		rc.mu.Unlock()
		rc.answer(n, w, r)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// answerAlways answers every request with status.
func answerAlways(status int) func(int, http.ResponseWriter, *http.Request) {
	return func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// endpoint returns an Endpoint for this loopback receiver, which needs
// AllowPrivate.
func (rc *receiver) endpoint(t testing.TB, name string) webhook.Endpoint {
	return webhook.Endpoint{
		Name:         name,
		URL:          rc.srv.URL + "/webhooks",
		Secrets:      []webhook.Secret{mustSecret(t, currentSecretText)},
		Timeout:      2 * time.Second,
		AllowPrivate: true,
	}
}

// testOptions retries quickly so tests never wait long.
func testOptions(clock *fakeClock) webhook.Options {
	return webhook.Options{
		InProcessRetries: 2,
		BackoffMin:       time.Millisecond,
		BackoffMax:       5 * time.Millisecond,
		BreakerFailures:  100,
		BreakerCooldown:  time.Minute,
		Now:              clock.Now,
		UserAgent:        "mulligan-test",
	}
}

var testMessage = webhook.Message{
	ID:   "evt_01JXYZTEST",
	Body: []byte(`{"event_id":"evt_01JXYZTEST","event_type":"operation.succeeded"}`),
}

// attemptTime is the instant an attempt was signed, from its webhook-timestamp.
func attemptTime(t testing.TB, h http.Header) time.Time {
	t.Helper()
	secs, err := strconv.ParseInt(h.Get(webhook.HeaderTimestamp), 10, 64)
	if err != nil {
		t.Fatalf("webhook-timestamp %q is not unix seconds", h.Get(webhook.HeaderTimestamp))
	}
	return time.Unix(secs, 0)
}

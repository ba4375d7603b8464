package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/webhook"
)

func TestDeliveryIsASignedStandardWebhook(t *testing.T) {
	rc := newReceiver(t, answerAlways(http.StatusNoContent))
	clock := newFakeClock(0)
	d := webhook.NewDeliverer(testOptions(clock))
	ep := rc.endpoint(t, "consumer_a")

	out := d.Deliver(context.Background(), ep, testMessage)

	if out.Result != webhook.Delivered || out.Attempts != 1 || out.StatusCode != http.StatusNoContent || out.Err != nil {
		t.Fatalf("Deliver = %+v, want Delivered in 1 attempt with 204", out)
	}
	reqs := rc.requests()
	if len(reqs) != 1 {
		t.Fatalf("receiver got %d requests, want 1", len(reqs))
	}
	got := reqs[0]
	for header, want := range map[string]string{
		"Content-Type":   "application/json",
		"User-Agent":     "mulligan-test",
		webhook.HeaderID: testMessage.ID,
	} {
		if v := got.header.Get(header); v != want {
			t.Errorf("%s = %q, want %q", header, v, want)
		}
	}
	if string(got.body) != string(testMessage.Body) {
		t.Errorf("body = %s, want %s", got.body, testMessage.Body)
	}
	if err := webhook.Verify(ep.Secrets, got.header, got.body, clock.Now()); err != nil {
		t.Errorf("the delivery does not verify: %v", err)
	}
}

func TestResponseStatusDecidesTheResult(t *testing.T) {
	tests := []struct {
		status   int
		want     webhook.Result
		attempts int
	}{
		{http.StatusOK, webhook.Delivered, 1},
		{http.StatusAccepted, webhook.Delivered, 1},
		{http.StatusGone, webhook.Disabled, 1},
		{http.StatusBadRequest, webhook.DeadLetter, 1},
		{http.StatusUnauthorized, webhook.DeadLetter, 1},
		{http.StatusNotFound, webhook.DeadLetter, 1},
		{http.StatusUnprocessableEntity, webhook.DeadLetter, 1},
		{http.StatusMovedPermanently, webhook.RetryLater, 1}, // a failure, but not retried in process
		{http.StatusRequestTimeout, webhook.RetryLater, 3},
		{http.StatusTooManyRequests, webhook.RetryLater, 3},
		{http.StatusInternalServerError, webhook.RetryLater, 3},
		{http.StatusServiceUnavailable, webhook.RetryLater, 3},
	}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.status), func(t *testing.T) {
			rc := newReceiver(t, answerAlways(tt.status))
			d := webhook.NewDeliverer(testOptions(newFakeClock(time.Second)))

			out := d.Deliver(context.Background(), rc.endpoint(t, "ep"), testMessage)

			if out.Result != tt.want || out.Attempts != tt.attempts || out.StatusCode != tt.status {
				t.Fatalf("Deliver = %v in %d attempts (status %d), want %v in %d",
					out.Result, out.Attempts, out.StatusCode, tt.want, tt.attempts)
			}
			if n := len(rc.requests()); n != tt.attempts {
				t.Errorf("receiver got %d requests, want %d", n, tt.attempts)
			}
			if (out.Err == nil) != (tt.want == webhook.Delivered) {
				t.Errorf("Err = %v for %v", out.Err, out.Result)
			}
		})
	}
}

func TestRetryIsResignedWithAFreshTimestamp(t *testing.T) {
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	d := webhook.NewDeliverer(testOptions(newFakeClock(time.Second)))
	ep := rc.endpoint(t, "ep")

	out := d.Deliver(context.Background(), ep, testMessage)

	if out.Result != webhook.Delivered || out.Attempts != 2 {
		t.Fatalf("Deliver = %v in %d attempts, want Delivered in 2", out.Result, out.Attempts)
	}
	reqs := rc.requests()
	first, second := reqs[0].header, reqs[1].header
	if first.Get(webhook.HeaderID) != second.Get(webhook.HeaderID) {
		t.Errorf("webhook-id changed across retries: %q then %q", first.Get(webhook.HeaderID), second.Get(webhook.HeaderID))
	}
	if first.Get(webhook.HeaderTimestamp) == second.Get(webhook.HeaderTimestamp) {
		t.Errorf("both attempts carry webhook-timestamp %s", first.Get(webhook.HeaderTimestamp))
	}
	for i, r := range reqs {
		if err := webhook.Verify(ep.Secrets, r.header, r.body, attemptTime(t, r.header)); err != nil {
			t.Errorf("attempt %d does not verify: %v", i+1, err)
		}
	}
}

func TestRetryAfterIsReportedAndLongOnesAreLeftToTheOutbox(t *testing.T) {
	clock := newFakeClock(0)
	tests := []struct {
		name       string
		retryAfter string
		want       time.Duration
	}{
		{"delay seconds", "120", 2 * time.Minute},
		{"HTTP date", clock.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat), 90 * time.Second},
		{"beyond MaxRetryAfter", "999999999999", webhook.MaxRetryAfter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", tt.retryAfter)
				w.WriteHeader(http.StatusTooManyRequests)
			})
			d := webhook.NewDeliverer(testOptions(clock))

			out := d.Deliver(context.Background(), rc.endpoint(t, "ep"), testMessage)

			if out.Result != webhook.RetryLater || out.RetryAfter != tt.want {
				t.Fatalf("Deliver = %v with RetryAfter %v, want RetryLater with %v", out.Result, out.RetryAfter, tt.want)
			}
			if out.Attempts != 1 {
				t.Errorf("Attempts = %d, want 1: a Retry-After beyond BackoffMax is not waited for in process", out.Attempts)
			}
		})
	}
}

func TestRedirectIsNotFollowed(t *testing.T) {
	target := newReceiver(t, answerAlways(http.StatusOK))
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.srv.URL+"/elsewhere", http.StatusFound)
	})
	d := webhook.NewDeliverer(testOptions(newFakeClock(0)))

	out := d.Deliver(context.Background(), rc.endpoint(t, "ep"), testMessage)

	if out.Result != webhook.RetryLater || out.StatusCode != http.StatusFound || out.Attempts != 1 {
		t.Fatalf("Deliver = %v (status %d, %d attempts), want RetryLater with 302 in 1 attempt", out.Result, out.StatusCode, out.Attempts)
	}
	if n := len(target.requests()); n != 0 {
		t.Fatalf("redirect target got %d requests, want none", n)
	}
}

func TestSlowEndpointTimesOutPerAttempt(t *testing.T) {
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers; the sender gives up
	})
	opts := testOptions(newFakeClock(0))
	opts.InProcessRetries = 1
	d := webhook.NewDeliverer(opts)
	ep := rc.endpoint(t, "ep")
	ep.Timeout = 50 * time.Millisecond

	out := d.Deliver(context.Background(), ep, testMessage)

	if out.Result != webhook.RetryLater || out.Attempts != 2 || !errors.Is(out.Err, context.DeadlineExceeded) {
		t.Fatalf("Deliver = %v in %d attempts (%v), want RetryLater in 2 with a deadline error", out.Result, out.Attempts, out.Err)
	}
}

func TestUnusableDeliveriesAreDeadLetteredWithoutSending(t *testing.T) {
	rc := newReceiver(t, answerAlways(http.StatusOK))
	d := webhook.NewDeliverer(testOptions(newFakeClock(0)))
	tests := []struct {
		name string
		edit func(*webhook.Endpoint, *webhook.Message)
	}{
		{"endpoint without secret", func(ep *webhook.Endpoint, _ *webhook.Message) { ep.Secrets = nil }},
		{"non-http URL", func(ep *webhook.Endpoint, _ *webhook.Message) { ep.URL = strings.Replace(ep.URL, "http", "ftp", 1) }},
		{"relative URL", func(ep *webhook.Endpoint, _ *webhook.Message) { ep.URL = "/webhooks" }},
		{"empty message id", func(_ *webhook.Endpoint, m *webhook.Message) { m.ID = "" }},
		{"message id with the signature separator", func(_ *webhook.Endpoint, m *webhook.Message) { m.ID = "evt.1" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep, msg := rc.endpoint(t, "ep"), testMessage
			tt.edit(&ep, &msg)

			out := d.Deliver(context.Background(), ep, msg)

			if out.Result != webhook.DeadLetter || out.Attempts != 0 || out.Err == nil {
				t.Fatalf("Deliver = %+v, want DeadLetter in 0 attempts with an error", out)
			}
		})
	}
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("receiver got %d requests, want none", n)
	}
}

func TestCallerCancellationIsRetryLater(t *testing.T) {
	rc := newReceiver(t, answerAlways(http.StatusOK))
	d := webhook.NewDeliverer(testOptions(newFakeClock(0)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	out := d.Deliver(ctx, rc.endpoint(t, "ep"), testMessage)

	if out.Result != webhook.RetryLater || !errors.Is(out.Err, context.Canceled) {
		t.Fatalf("Deliver = %v (%v), want RetryLater with context.Canceled", out.Result, out.Err)
	}
}

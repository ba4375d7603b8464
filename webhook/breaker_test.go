package webhook_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/webhook"
)

// breakerOptions opens a breaker after 3 failed Deliver calls, for 50ms, with
// no in-process retries so each call is one request.
func breakerOptions() webhook.Options {
	opts := testOptions(newFakeClock(time.Second))
	opts.InProcessRetries = 0
	opts.BreakerFailures = 3
	opts.BreakerCooldown = 50 * time.Millisecond
	return opts
}

// waitForState polls the breaker, whose cooldown runs on the real clock.
func waitForState(t *testing.T, d *webhook.Deliverer, name, want string) {
	t.Helper()
	testkit.WaitFor(t, 2*time.Second, "breaker "+name+" "+want, func() bool { return d.BreakerState(name) == want })
}

func TestBreakerOpensAfterConsecutiveFailuresAndSendsNothing(t *testing.T) {
	rc := newReceiver(t, answerAlways(http.StatusServiceUnavailable))
	d := webhook.NewDeliverer(breakerOptions())
	ep := rc.endpoint(t, "flaky")

	for i := range 3 {
		if d.BreakerState("flaky") != "closed" {
			t.Fatalf("breaker opened after %d failures, want 3", i)
		}
		if out := d.Deliver(context.Background(), ep, testMessage); out.Result != webhook.RetryLater {
			t.Fatalf("delivery %d = %v, want RetryLater", i+1, out.Result)
		}
	}
	if got := d.BreakerState("flaky"); got != "open" {
		t.Fatalf("breaker is %s after 3 failures, want open", got)
	}

	out := d.Deliver(context.Background(), ep, testMessage)

	if out.Result != webhook.BreakerOpen || out.Attempts != 0 || out.Err == nil {
		t.Fatalf("Deliver on an open breaker = %+v, want BreakerOpen in 0 attempts", out)
	}
	if n := len(rc.requests()); n != 3 {
		t.Fatalf("receiver got %d requests, want 3 (none while open)", n)
	}
	if got := d.BreakerState("other"); got != "closed" {
		t.Errorf("another endpoint's breaker is %s, want closed", got)
	}
}

func TestHalfOpenBreakerLetsExactlyOneProbeThrough(t *testing.T) {
	var healthy atomic.Bool
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		arrived <- struct{}{}
		<-release
		w.WriteHeader(http.StatusOK)
	})
	d := webhook.NewDeliverer(breakerOptions())
	ep := rc.endpoint(t, "recovering")
	for range 3 {
		d.Deliver(context.Background(), ep, testMessage)
	}
	healthy.Store(true)
	waitForState(t, d, "recovering", "half-open")

	probe := make(chan webhook.Outcome)
	go func() { probe <- d.Deliver(context.Background(), ep, testMessage) }()
	<-arrived
	if out := d.Deliver(context.Background(), ep, testMessage); out.Result != webhook.BreakerOpen {
		t.Errorf("second delivery during the probe = %v, want BreakerOpen", out.Result)
	}
	close(release)

	if out := <-probe; out.Result != webhook.Delivered {
		t.Fatalf("probe = %v (%v), want Delivered", out.Result, out.Err)
	}
	if got := d.BreakerState("recovering"); got != "closed" {
		t.Fatalf("breaker is %s after a successful probe, want closed", got)
	}
	if n := len(rc.requests()); n != 4 {
		t.Fatalf("receiver got %d requests, want 3 failures and 1 probe", n)
	}
}

func TestFailedProbeReopensTheBreaker(t *testing.T) {
	rc := newReceiver(t, answerAlways(http.StatusInternalServerError))
	d := webhook.NewDeliverer(breakerOptions())
	ep := rc.endpoint(t, "down")
	for range 3 {
		d.Deliver(context.Background(), ep, testMessage)
	}
	waitForState(t, d, "down", "half-open")

	if out := d.Deliver(context.Background(), ep, testMessage); out.Result != webhook.RetryLater {
		t.Fatalf("probe = %v, want RetryLater", out.Result)
	}
	if got := d.BreakerState("down"); got != "open" {
		t.Fatalf("breaker is %s after a failed probe, want open", got)
	}
}

func TestAnsweringEndpointsDoNotTripTheBreaker(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusGone} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			rc := newReceiver(t, answerAlways(status))
			d := webhook.NewDeliverer(breakerOptions())
			ep := rc.endpoint(t, "picky")
			for range 5 {
				d.Deliver(context.Background(), ep, testMessage)
			}
			if got := d.BreakerState("picky"); got != "closed" {
				t.Fatalf("breaker is %s after 5 answered deliveries, want closed", got)
			}
		})
	}
}

func TestCallerCancellationDoesNotTripTheBreaker(t *testing.T) {
	rc := newReceiver(t, answerAlways(http.StatusOK))
	d := webhook.NewDeliverer(breakerOptions())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 5 {
		d.Deliver(ctx, rc.endpoint(t, "ep"), testMessage)
	}
	if got := d.BreakerState("ep"); got != "closed" {
		t.Fatalf("breaker is %s after canceled deliveries, want closed", got)
	}
}

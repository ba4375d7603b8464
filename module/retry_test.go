package module

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

func TestRetryOnChoosesTheStatusesRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, retryOn, status, code string
		attempts                    int
	}{
		{"500 retried when listed", "retry_on 500 503", "500", "UPSTREAM_ERROR", 3},
		{"503 not retried when left out", "retry_on 500", "503", "UPSTREAM_UNAVAILABLE", 1},
		{"a 4xx retried when listed", "retry_on 409", "409", "UPSTREAM_REJECTED", 3},
		{"the default retries 503", "", "503", "UPSTREAM_UNAVAILABLE", 3},
		{"the default leaves 500", "", "500", "UPSTREAM_ERROR", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startHandler(t, modelserver.Config{}, "async {\n retries 2\n "+tc.retryOn+"\n}")
			_, op := g.submit(t, "", "X-Mock-Status", tc.status)
			final := g.await(t, op.OperationID)
			if final.Status != "failed" || final.Error == nil || final.Error.Code != tc.code || final.Attempts != tc.attempts {
				t.Fatalf("got %+v, want failed %s after %d attempts", final, tc.code, tc.attempts)
			}
			if n := g.model.Stats().Received; n != int64(tc.attempts) {
				t.Fatalf("the upstream ran %d times, want %d", n, tc.attempts)
			}
		})
	}
}

func TestRetryOnOutsideErrorStatusesIsRejected(t *testing.T) {
	for _, tc := range []struct{ src, message string }{
		{"mulligan {\n async {\n retry_on 200\n }\n}", `retry_on takes statuses from 400 to 599, got "200"`},
		{"mulligan {\n async {\n retry_on 5xx\n }\n}", `retry_on takes statuses from 400 to 599, got "5xx"`},
		{"mulligan {\n async {\n retry_on\n }\n}", "wrong argument count"},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.message) {
			t.Errorf("%q: got %v, want %q", tc.src, err, tc.message)
		}
	}
	// The same rule for JSON configs.
	cfg := AsyncConfig{RetryOn: []int{302}}
	cfg.setDefaults()
	if err := cfg.validate(); err == nil || err.Error() != "async: retry_on takes statuses from 400 to 599, got [302]" {
		t.Errorf("JSON retry_on [302]: %v", err)
	}
}

// TestEachBlockKeepsItsRetryOnAndTypeOnASharedStorage: two blocks on one storage, one retrying
// 500 and one not; each operation is run with its own block's retry_on and named by its type.
func TestEachBlockKeepsItsRetryOnAndTypeOnASharedStorage(t *testing.T) {
	sites := startSites(t, modelserver.Config{},
		"async {\n retries 2\n retry_on 500\n type summarize\n}",
		"async {\n retries 2\n type translate\n}")
	for i, want := range []struct {
		typ      string
		attempts int
	}{{"summarize", 3}, {"translate", 1}} {
		_, op := sites[i].submit(t, "", "X-Mock-Status", "500")
		final := sites[i].await(t, op.OperationID)
		res := decodeResource(t, sites[i].get(op.StatusURL))
		if final.Attempts != want.attempts || res.str("type") != want.typ {
			t.Errorf("site %d: %d attempts, type %q; want %d, %q", i, final.Attempts, res.str("type"), want.attempts, want.typ)
		}
	}
}

package module

import (
	"github.com/caddyserver/caddy/v2"
	"testing"
	"time"
)

func TestConversionFollowsModeAndPrefer(t *testing.T) {
	prefer := &AsyncConfig{Mode: ModePrefer}
	always := &AsyncConfig{Mode: ModeAlways}
	after := &AsyncConfig{Mode: ModeAfter, After: caddy.Duration(2 * time.Second)}
	for _, tc := range []struct {
		name    string
		cfg     *AsyncConfig
		prefer  []string
		convert bool
		window  time.Duration
	}{
		{"prefer without the header stays synchronous", prefer, nil, false, 0},
		{"prefer with respond-async converts at once", prefer, []string{"respond-async"}, true, 0},
		{"prefer honours wait", prefer, []string{"respond-async, wait=5"}, true, 5 * time.Second},
		{"tokens are case-insensitive, parameters ignored", prefer, []string{"Respond-Async; foo=bar"}, true, 0},
		{"a malformed Prefer is ignored", prefer, []string{"wait=soon,,=;"}, false, 0},
		{"always converts", always, nil, true, 0},
		{"after uses its window", after, nil, true, 2 * time.Second},
		{"wait overrides the window", after, []string{"wait=10"}, true, 10 * time.Second},
		{"the first wait wins", after, []string{"wait=1", "wait=9"}, true, time.Second},
	} {
		convert, window := conversion(tc.cfg, tc.prefer)
		if convert != tc.convert || window != tc.window {
			t.Errorf("%s: got %v %v, want %v %v", tc.name, convert, window, tc.convert, tc.window)
		}
	}
}

package main

import (
	"strings"
	"testing"
)

func TestBusyAddressesAreNamed(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       sidecarConfig
		answering string
		want      []string // substrings of the refusal; none: no refusal
	}{
		{"free", sidecarConfig{Port: "8080"}, "", nil},
		{"listen on every interface is reached on loopback", sidecarConfig{Port: "8080"}, "127.0.0.1:8080",
			[]string{"MULLIGAN_LISTEN: 127.0.0.1:8080 already answers"}},
		{"listen on one interface", sidecarConfig{Bind: "127.0.0.2", Port: "9"}, "127.0.0.2:9",
			[]string{"MULLIGAN_LISTEN: 127.0.0.2:9"}},
		{"default admin", sidecarConfig{Port: "8080"}, "localhost:2019", []string{"MULLIGAN_ADMIN: localhost:2019 already answers"}},
		{"admin by port only", sidecarConfig{Port: "8080", Admin: ":2999"}, "127.0.0.1:2999", []string{"MULLIGAN_ADMIN: 127.0.0.1:2999"}},
		{"admin off is not looked at", sidecarConfig{Port: "8080", Admin: "off"}, "localhost:2019", nil},
		{"admin on a unix socket is not looked at", sidecarConfig{Port: "8080", Admin: "unix//run/caddy.sock"}, "localhost:2019", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.refuseBusyAddresses(func(addr string) bool { return addr == tc.answering })
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("not refused")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("refusal %q does not say %q", err, w)
				}
			}
		})
	}
}

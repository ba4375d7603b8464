package webhook_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"testing"

	"github.com/mulligan-gw/mulligan/webhook"
)

func TestIsBlocked(t *testing.T) {
	tests := []struct {
		addr    string
		blocked bool
	}{
		{"127.0.0.1", true},
		{"127.255.0.9", true},
		{"::1", true},
		{"10.1.2.3", true},
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"192.168.1.1", true},
		{"169.254.169.254", true}, // cloud metadata
		{"100.64.0.1", true},      // carrier-grade NAT
		{"0.0.0.0", true},
		{"255.255.255.255", true},
		{"224.0.0.1", true},
		{"240.0.0.1", true},
		{"192.0.2.10", true},
		{"198.18.0.1", true},
		{"203.0.113.7", true},
		{"::", true},
		{"fc00::1", true},
		{"fd12:3456::1", true},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"ff02::1", true},
		{"2001:db8::1", true},
		{"::ffff:127.0.0.1", true},
		{"::ffff:169.254.169.254", true},
		{"::127.0.0.1", true}, // deprecated IPv4-compatible form
		{"64:ff9b::7f00:1", true},
		{"64:ff9b::a9fe:a9fe", true},
		{"2002:7f00:1::1", true},   // 6to4 around 127.0.0.1
		{"2002:c0a8:101::1", true}, // 6to4 around 192.168.1.1
		{"2001::1", true},          // Teredo
		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"172.32.0.1", false},
		{"2606:4700::1111", false},
		{"::ffff:8.8.8.8", false},
		{"64:ff9b::808:808", false}, // NAT64 around 8.8.8.8
		{"2002:808:808::1", false},  // 6to4 around 8.8.8.8
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			if got := webhook.IsBlocked(netip.MustParseAddr(tt.addr)); got != tt.blocked {
				t.Fatalf("IsBlocked(%s) = %v, want %v", tt.addr, got, tt.blocked)
			}
		})
	}
	if !webhook.IsBlocked(netip.Addr{}) {
		t.Error("the zero Addr must be blocked")
	}
}

// The guard is exercised without dialling: public addresses are only ever
// passed to Control, never connected to.
func TestControlRefusesBlockedAddressesBeforeConnecting(t *testing.T) {
	guard := webhook.Control(false)
	err := guard("tcp4", "169.254.169.254:80", nil)
	var blocked *webhook.BlockedAddressError
	if !errors.As(err, &blocked) || !errors.Is(err, webhook.ErrBlockedAddress) {
		t.Fatalf("Control(169.254.169.254:80) = %v, want a *BlockedAddressError", err)
	}
	if blocked.Addr != netip.MustParseAddr("169.254.169.254") {
		t.Errorf("BlockedAddressError.Addr = %s", blocked.Addr)
	}
	for _, addr := range []string{"8.8.8.8:443", "[2606:4700::1111]:443"} {
		if err := guard("tcp", addr, nil); err != nil {
			t.Errorf("Control(%s) = %v, want nil", addr, err)
		}
	}
	if err := guard("tcp", "not-an-address", nil); !errors.Is(err, webhook.ErrBlockedAddress) {
		t.Errorf("Control(unparsable) = %v, want ErrBlockedAddress", err)
	}
	if err := webhook.Control(true)("tcp", "127.0.0.1:80", nil); err != nil {
		t.Errorf("Control(allowPrivate)(127.0.0.1) = %v, want nil", err)
	}
}

func TestNewDialerRefusesLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := webhook.NewDialer(false, 0).DialContext(context.Background(), "tcp", ln.Addr().String())
	if err == nil {
		conn.Close()
	}
	if !errors.Is(err, webhook.ErrBlockedAddress) {
		t.Fatalf("dial %s = %v, want ErrBlockedAddress", ln.Addr(), err)
	}
}

func TestDeliveryToPrivateAddressIsRefusedWithoutAllowPrivate(t *testing.T) {
	rc := newReceiver(t, answerAlways(http.StatusOK))
	u, err := url.Parse(rc.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	d := webhook.NewDeliverer(testOptions(newFakeClock(0)))
	for name, target := range map[string]string{
		"IP literal":         rc.srv.URL + "/webhooks",
		"localhost hostname": "http://localhost:" + u.Port() + "/webhooks",
	} {
		t.Run(name, func(t *testing.T) {
			ep := rc.endpoint(t, "private")
			ep.URL, ep.AllowPrivate = target, false

			out := d.Deliver(context.Background(), ep, testMessage)

			if out.Result != webhook.DeadLetter || !errors.Is(out.Err, webhook.ErrBlockedAddress) {
				t.Fatalf("Deliver = %v (%v), want DeadLetter with ErrBlockedAddress", out.Result, out.Err)
			}
			if out.Attempts != 1 {
				t.Errorf("Attempts = %d, want 1 (a refused dial is not retried)", out.Attempts)
			}
		})
	}
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("receiver got %d requests, want none", n)
	}
}

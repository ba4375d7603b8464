package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// ErrBlockedAddress is the sentinel every SSRF refusal wraps; test with
// errors.Is(err, ErrBlockedAddress).
var ErrBlockedAddress = errors.New("webhook: address is blocked (loopback, private, link-local or special-purpose)")

// BlockedAddressError reports the resolved address a dial was refused for.
type BlockedAddressError struct {
	// Addr is the IP address the connection would have gone to.
	Addr netip.Addr
}

// Error names the refused address.
func (e *BlockedAddressError) Error() string {
	return fmt.Sprintf("webhook: refusing to connect to %s: loopback, private, link-local or special-purpose address (set allow_private to permit)", e.Addr)
}

// Unwrap makes errors.Is(err, ErrBlockedAddress) true.
func (e *BlockedAddressError) Unwrap() error { return ErrBlockedAddress }

// blockedV4 lists the IPv4 special-purpose ranges (IANA registry, RFC 6890)
// that a webhook must never reach: they are internal, unroutable or not
// unicast.
var blockedV4 = prefixes(
	"0.0.0.0/8",       // "this network", includes 0.0.0.0
	"10.0.0.0/8",      // RFC 1918 private
	"100.64.0.0/10",   // RFC 6598 carrier-grade NAT
	"127.0.0.0/8",     // loopback
	"169.254.0.0/16",  // link-local, includes cloud metadata 169.254.169.254
	"172.16.0.0/12",   // RFC 1918 private
	"192.0.0.0/24",    // IETF protocol assignments
	"192.0.2.0/24",    // TEST-NET-1 documentation
	"192.88.99.0/24",  // deprecated 6to4 relay anycast
	"192.168.0.0/16",  // RFC 1918 private
	"198.18.0.0/15",   // benchmarking
	"198.51.100.0/24", // TEST-NET-2 documentation
	"203.0.113.0/24",  // TEST-NET-3 documentation
	"224.0.0.0/4",     // multicast
	"240.0.0.0/4",     // reserved, includes broadcast 255.255.255.255
)

// globalUnicastV6 is 2000::/3; every IPv6 address outside it (loopback,
// unspecified, ULA fc00::/7, link-local fe80::/10, multicast ff00::/8, ...)
// is refused, except the IPv4-embedding forms checked through their IPv4.
var globalUnicastV6 = netip.MustParsePrefix("2000::/3")

// blockedV6 lists the special-purpose ranges inside 2000::/3.
var blockedV6 = prefixes(
	"2001::/23",     // IETF protocol assignments: Teredo, benchmarking 2001:2::/48, ORCHID
	"2001:db8::/32", // documentation
	"3fff::/20",     // documentation (RFC 9637)
)

// IPv6 forms that embed an IPv4 address, which is checked instead.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052 well-known NAT64 prefix; IPv4 in the last 4 bytes
	sixToFour = netip.MustParsePrefix("2002::/16")    // RFC 3056 6to4; IPv4 in bytes 2..5
)

// IsBlocked reports whether a webhook may not connect to addr without
// allow_private: loopback, RFC 1918, carrier-grade NAT, link-local (cloud
// metadata included), multicast, broadcast, reserved, unspecified,
// documentation and benchmarking ranges, IPv6 ULA, and IPv4-mapped, NAT64
// and 6to4 addresses whose embedded IPv4 is any of those. An invalid addr is
// blocked.
func IsBlocked(addr netip.Addr) bool {
	if !addr.IsValid() {
		return true
	}
	addr = addr.WithZone("").Unmap()
	if addr.Is4() {
		return containsAny(blockedV4, addr)
	}
	b := addr.As16()
	switch {
	case nat64.Contains(addr):
		return IsBlocked(netip.AddrFrom4([4]byte(b[12:16])))
	case sixToFour.Contains(addr):
		return IsBlocked(netip.AddrFrom4([4]byte(b[2:6])))
	case !globalUnicastV6.Contains(addr):
		return true
	}
	return containsAny(blockedV6, addr)
}

// Control returns a net.Dialer Control function that refuses, after DNS
// resolution and before connecting, every address [IsBlocked] reports, with
// a [*BlockedAddressError]. Checking the resolved address at dial time is what
// defeats DNS rebinding and redirects to internal names. With allowPrivate it
// allows everything.
func Control(allowPrivate bool) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		if allowPrivate {
			return nil
		}
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: cannot parse dial address %q: %v", ErrBlockedAddress, address, err)
		}
		if IsBlocked(ap.Addr()) {
			return &BlockedAddressError{Addr: ap.Addr()}
		}
		return nil
	}
}

// NewDialer returns a dialer with the SSRF guard installed (unless
// allowPrivate) and the given connect timeout.
func NewDialer(allowPrivate bool, timeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout:   timeout,
		KeepAlive: 30 * time.Second,
		Control:   Control(allowPrivate),
	}
}

func prefixes(cidrs ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(cidrs))
	for i, c := range cidrs {
		out[i] = netip.MustParsePrefix(c)
	}
	return out
}

func containsAny(ps []netip.Prefix, addr netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

package main

import (
	"fmt"
	"net"
	"strings"
	"time"
)

// defaultAdmin is where Caddy serves its admin endpoint when MULLIGAN_ADMIN is unset.
const defaultAdmin = "localhost:2019"

// dialBusyWithin bounds the look for a process already answering on an address.
const dialBusyWithin = 500 * time.Millisecond

// refuseBusyAddresses refuses to start beside a process already answering where this one would
// listen. Caddy's listeners share their port (SO_REUSEPORT), so a second gateway on the same
// address would start without a word, and requests, admin and /metrics scrapes included, would
// land on either process (docs/operating.md, "Several replicas on one machine").
func (c *sidecarConfig) refuseBusyAddresses(answers func(addr string) bool) error {
	var busy []string
	if addr := c.listenDialAddr(); answers(addr) {
		busy = append(busy, fmt.Sprintf("MULLIGAN_LISTEN: %s already answers", addr))
	}
	if addr, ok := c.adminDialAddr(); ok && answers(addr) {
		busy = append(busy, fmt.Sprintf("MULLIGAN_ADMIN: %s already answers", addr))
	}
	if len(busy) == 0 {
		return nil
	}
	return fmt.Errorf("another process is serving where this gateway would (%s); stop it, or give this one its own MULLIGAN_LISTEN and MULLIGAN_ADMIN",
		strings.Join(busy, "; "))
}

// listenDialAddr is the gateway's listen address as a client reaches it: an empty host (every
// interface) is reached on loopback.
func (c *sidecarConfig) listenDialAddr() string {
	host := c.Bind
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, c.Port)
}

// adminDialAddr is the admin endpoint's TCP address; false when it is off or not TCP.
func (c *sidecarConfig) adminDialAddr() (string, bool) {
	addr := c.Admin
	switch {
	case addr == "":
		return defaultAdmin, true
	case addr == "off" || strings.HasPrefix(addr, "unix/") || strings.HasPrefix(addr, "unixpacket/"):
		return "", false
	}
	addr = strings.TrimPrefix(addr, "tcp/")
	if strings.HasPrefix(addr, ":") {
		addr = "127.0.0.1" + addr
	}
	return addr, true
}

// answersTCP reports whether something accepts a TCP connection at addr.
func answersTCP(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, dialBusyWithin)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

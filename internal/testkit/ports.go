package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
)

// Ports are picked below the kernel's ephemeral range: a port the kernel hands out as "free"
// (port 0) is an ephemeral one, which any outgoing connection of the machine may take as its
// local port between the pick and the gateway's bind ("address already in use", seen in CI).
// Below the range, only another listener can take it.
const (
	pickFrom      = 10000
	ephemeralFile = "/proc/sys/net/ipv4/ip_local_port_range"
	defaultLow    = 32768
)

var (
	pickedMu sync.Mutex
	picked   = map[int]bool{} // ports this process handed out: never twice
)

// FreePorts returns n distinct free loopback ports, chosen below the ephemeral range and
// holding each until all are chosen. Call it after the test's other listeners are up: Caddy
// binds with SO_REUSEPORT, so a port another socket of this process still holds would be shared
// with it.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := PickPorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// PickPorts is FreePorts for a program (the benchmark): it returns the failure.
func PickPorts(n int) ([]int, error) {
	pickedMu.Lock()
	defer pickedMu.Unlock()
	high := ephemeralLow()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("no free loopback port below %d after %d tries", high, tries)
		}
		port := pickFrom + rand.IntN(high-pickFrom)
		if picked[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // taken
		}
		defer l.Close()
		picked[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}

// ephemeralLow is the lowest port of the kernel's ephemeral range (Linux), else the usual one.
func ephemeralLow() int {
	b, err := os.ReadFile(ephemeralFile)
	if err != nil {
		return defaultLow
	}
	var low, high int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &low, &high); err != nil || low <= pickFrom+1000 {
		return defaultLow
	}
	return low
}

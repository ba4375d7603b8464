package testkit

import (
	"net"
	"testing"
)

// FreePorts returns n distinct free loopback ports, holding each until all are chosen. Call it
// after the test's other listeners are up: Caddy binds with SO_REUSEPORT, so a port another
// socket of this process still holds would be shared with it.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

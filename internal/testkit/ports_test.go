package testkit

import (
	"fmt"
	"net"
	"testing"
)

func TestFreePortsAreDistinctBindableAndBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	seen := map[int]bool{}
	for range 20 {
		for _, port := range FreePorts(t, 3) {
			if port < pickFrom || port >= low {
				t.Fatalf("port %d is outside [%d, %d)", port, pickFrom, low)
			}
			if seen[port] {
				t.Fatalf("port %d handed out twice", port)
			}
			seen[port] = true
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatalf("port %d is not free: %v", port, err)
			}
			l.Close()
		}
	}
}

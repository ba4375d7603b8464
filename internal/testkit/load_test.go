package testkit

import (
	"sync"
	"testing"
)

func TestKeyedLoadSendsDistinctKeysWithinItsBound(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	l := StartKeyedLoad(4, 25, "k", func(key string) bool {
		mu.Lock()
		defer mu.Unlock()
		seen[key] = true
		return true
	})
	l.wg.Wait() // every client reaches its bound
	l.Stop()
	if len(seen) != 100 || !seen["k-3-24"] {
		t.Fatalf("%d distinct keys, want 100 (k-0-0 to k-3-24)", len(seen))
	}
}

func TestKeyedLoadClientEndsWhenSendSaysSo(t *testing.T) {
	var mu sync.Mutex
	sent := 0
	l := StartKeyedLoad(3, 1000, "k", func(string) bool {
		mu.Lock()
		defer mu.Unlock()
		sent++
		return false
	})
	l.wg.Wait() // ends without Stop: each client stopped after its first send
	l.Stop()
	if sent != 3 {
		t.Fatalf("%d sends, want one per client", sent)
	}
}

func TestFreePortsAreDistinct(t *testing.T) {
	ports := FreePorts(t, 5)
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v", ports)
		}
		seen[p] = true
	}
}

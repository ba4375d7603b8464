package main

import "sync"

// holdGate holds the bench upstreams' streams that ask for it (?hold=1) until releaseAll: the
// gateways' memory is read while they are live.
type holdGate struct {
	mu      sync.Mutex
	release chan struct{}
}

func newHoldGate() *holdGate { return &holdGate{release: make(chan struct{})} }

// held is closed at the next releaseAll.
func (g *holdGate) held() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.release
}

// releaseAll lets every held stream finish, and arms a fresh release for the next ones.
func (g *holdGate) releaseAll() {
	g.mu.Lock()
	close(g.release)
	g.release = make(chan struct{})
	g.mu.Unlock()
}

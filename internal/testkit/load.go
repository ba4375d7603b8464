package testkit

import (
	"fmt"
	"sync"
)

// KeyedLoad is a set of clients sending keyed requests as fast as they can, each key new:
// "<prefix>-<client>-<seq>".
type KeyedLoad struct {
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// StartKeyedLoad starts clients goroutines, each calling send with its next key until Stop,
// until send returns false (the gateway died under it, say), or after perClient keys, the
// bound that keeps a test's loop finite.
func StartKeyedLoad(clients, perClient int, prefix string, send func(key string) bool) *KeyedLoad {
	l := &KeyedLoad{stop: make(chan struct{})}
	for c := range clients {
		l.wg.Go(func() {
			for i := range perClient {
				select {
				case <-l.stop:
					return
				default:
				}
				if !send(fmt.Sprintf("%s-%d-%d", prefix, c, i)) {
					return
				}
			}
		})
	}
	return l
}

// Stop ends the load and waits for the requests under way.
func (l *KeyedLoad) Stop() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

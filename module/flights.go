package module

import "sync"

// flights lets duplicates of an in-flight keyed request wait for its end (wait_inflight)
// instead of polling storage. It only knows about claims held by this process.
type flights struct {
	mu   sync.Mutex
	done map[string]chan struct{}
}

func newFlights() *flights { return &flights{done: map[string]chan struct{}{}} }

// start registers a claim on key and returns the function that ends it.
func (f *flights) start(key string) func() {
	ch := make(chan struct{})
	f.mu.Lock()
	f.done[key] = ch
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if f.done[key] == ch {
			delete(f.done, key)
		}
		f.mu.Unlock()
		close(ch)
	}
}

// wait returns a channel closed when the claim on key ends, or nil when this process holds none.
func (f *flights) wait(key string) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.done[key]
}

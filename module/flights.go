package module

import "sync"

// flights lets duplicates of an in-flight keyed request wait for its end (wait_inflight), or
// for its answer to begin as a stream they can join, instead of polling storage. It only knows
// about claims held by this process.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

// flight is one claim held by this process: done is closed when it ends, begun when its answer
// begins as a recorded stream.
type flight struct {
	done, begun chan struct{}
	beginOnce   sync.Once
}

func newFlights() *flights { return &flights{m: map[string]*flight{}} }

// start registers a claim on key and returns the function that ends it.
func (f *flights) start(key string) func() {
	fl := &flight{done: make(chan struct{}), begun: make(chan struct{})}
	f.mu.Lock()
	f.m[key] = fl
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if f.m[key] == fl {
			delete(f.m, key)
		}
		f.mu.Unlock()
		close(fl.done)
	}
}

// began says that the answer of the claim on key has begun as a recorded stream.
func (f *flights) began(key string) {
	f.mu.Lock()
	fl := f.m[key]
	f.mu.Unlock()
	if fl != nil {
		fl.beginOnce.Do(func() { close(fl.begun) })
	}
}

// wait returns channels closed when the claim on key ends and when its answer begins as a
// stream; both nil when this process holds no claim on key.
func (f *flights) wait(key string) (done, begun <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[key]; fl != nil {
		return fl.done, fl.begun
	}
	return nil, nil
}

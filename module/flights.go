package module

import (
	"sync"
	"sync/atomic"
)

// flights lets duplicates of an in-flight keyed request wait for its end (wait_inflight), or
// for its answer to begin as a stream they can join, instead of polling storage. It only knows
// about claims held by this process.
type flights struct {
	mu      sync.Mutex
	m       map[string]*flight
	waiters map[string]int // duplicates waiting for a stream to begin, by key
}

// flight is one claim held by this process (token): done is closed when it ends, begun when its
// answer begins as a recorded stream.
type flight struct {
	token       string
	done, begun chan struct{}
	beginOnce   sync.Once
}

// maxStreamWaiters bounds the duplicates of one key that wait in this process for its stream
// to begin: each holds a connection and its request body. The others are answered at once.
const maxStreamWaiters = 64

// streamWaiting counts the duplicates waiting in this process, across keys and configs, for a
// stream to begin: a test sees a duplicate has reached its wait without sleeping for it.
var streamWaiting atomic.Int64

func newFlights() *flights { return &flights{m: map[string]*flight{}, waiters: map[string]int{}} }

// start registers the claim held under token on key and returns the function that ends it.
func (f *flights) start(key, token string) func() {
	fl := &flight{token: token, done: make(chan struct{}), begun: make(chan struct{})}
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

// began says that the answer of the claim held under token on key has begun as a recorded
// stream (an older attempt that opens its stream late wakes nobody).
func (f *flights) began(key, token string) {
	f.mu.Lock()
	fl := f.m[key]
	f.mu.Unlock()
	if fl != nil && fl.token == token {
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

// enterWait counts one more duplicate waiting for key's stream to begin; false when
// maxStreamWaiters already do. leaveWait undoes it.
func (f *flights) enterWait(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.waiters[key] >= maxStreamWaiters {
		return false
	}
	f.waiters[key]++
	streamWaiting.Add(1)
	return true
}

func (f *flights) leaveWait(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	streamWaiting.Add(-1)
	if f.waiters[key]--; f.waiters[key] <= 0 {
		delete(f.waiters, key)
	}
}

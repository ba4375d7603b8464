package streams

import (
	"sync"
	"sync/atomic"
)

// Flights lets duplicates of an in-flight keyed request wait for its end (wait_inflight), or
// for its answer to begin as a stream they can join, instead of polling storage. It only knows
// about claims held by this process.
type Flights struct {
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

// MaxFlightWaiters bounds the duplicates of one key that wait in this process for its stream
// to begin: each holds a connection and its request body. The others are answered at once.
const MaxFlightWaiters = 64

// streamWaiting counts the duplicates waiting in this process, across keys and configs, for a
// stream to begin.
var streamWaiting atomic.Int64

// FlightWaiters is how many duplicates wait in this process for a stream to begin: a test sees
// a duplicate has reached its wait without sleeping for it.
func FlightWaiters() int64 { return streamWaiting.Load() }

// NewFlights returns an empty registry.
func NewFlights() *Flights { return &Flights{m: map[string]*flight{}, waiters: map[string]int{}} }

// Start registers the claim held under token on key and returns the function that ends it.
func (f *Flights) Start(key, token string) func() {
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

// Began says that the answer of the claim held under token on key has begun as a recorded
// stream (an older attempt that opens its stream late wakes nobody).
func (f *Flights) Began(key, token string) {
	f.mu.Lock()
	fl := f.m[key]
	f.mu.Unlock()
	if fl != nil && fl.token == token {
		fl.beginOnce.Do(func() { close(fl.begun) })
	}
}

// Wait returns channels closed when the claim on key ends and when its answer begins as a
// stream; both nil when this process holds no claim on key.
func (f *Flights) Wait(key string) (done, begun <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[key]; fl != nil {
		return fl.done, fl.begun
	}
	return nil, nil
}

// EnterWait counts one more duplicate waiting for key's stream to begin; false when
// MaxFlightWaiters already do. LeaveWait undoes it.
func (f *Flights) EnterWait(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.waiters[key] >= MaxFlightWaiters {
		return false
	}
	f.waiters[key]++
	streamWaiting.Add(1)
	return true
}

func (f *Flights) LeaveWait(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	streamWaiting.Add(-1)
	if f.waiters[key]--; f.waiters[key] <= 0 {
		delete(f.waiters, key)
	}
}

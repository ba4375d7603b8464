package badger

import (
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// groupSyncer makes writes durable in groups: every writer that committed registers and waits;
// one goroutine fsyncs once for all writers registered so far. A writer is released only by a
// sync that started after it registered, so its write is covered.
type groupSyncer struct {
	sync    func() error
	mu      sync.Mutex
	waiters []chan error
	kick    chan struct{}
	done    chan struct{}
	stopped chan struct{}
	observe atomic.Pointer[func(int)]
}

var errSyncerStopped = errors.New("store is closing")

func newGroupSyncer(sync func() error) *groupSyncer {
	g := &groupSyncer{sync: sync, kick: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	go g.run()
	return g
}

// wait blocks until an fsync that started after the call covers the caller's committed write.
func (g *groupSyncer) wait() error { return <-g.start() }

// start registers the caller's committed write for the next fsync, which it starts if none is
// waiting to, and returns where that fsync's outcome arrives (once).
func (g *groupSyncer) start() <-chan error {
	ch := make(chan error, 1)
	g.mu.Lock()
	select {
	case <-g.done:
		g.mu.Unlock()
		ch <- errSyncerStopped
		return ch
	default:
	}
	g.waiters = append(g.waiters, ch)
	g.mu.Unlock()
	select {
	case g.kick <- struct{}{}:
	default:
	}
	return ch
}

func (g *groupSyncer) run() {
	defer close(g.stopped)
	for {
		select {
		case <-g.done:
			g.flush(errSyncerStopped)
			return
		case <-g.kick:
			g.flush(nil)
		}
	}
}

func (g *groupSyncer) flush(failWith error) {
	g.mu.Lock()
	batch := g.waiters
	g.waiters = nil
	g.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	err := failWith
	if err == nil {
		err = g.sync()
		if o := g.observe.Load(); o != nil && *o != nil {
			(*o)(len(batch))
		}
	}
	for _, ch := range batch {
		ch <- err
	}
}

func (g *groupSyncer) stop() {
	g.mu.Lock()
	close(g.done)
	g.mu.Unlock()
	<-g.stopped
}

// keyLocks serialises writers of the same key inside this process, so that concurrent claims of
// one key queue up instead of failing Badger's optimistic conflict check over and over.
type keyLocks struct {
	seed    maphash.Seed
	stripes [256]sync.Mutex
}

func newKeyLocks() *keyLocks { return &keyLocks{seed: maphash.MakeSeed()} }

func (k *keyLocks) lock(key []byte) func() {
	m := &k.stripes[maphash.Bytes(k.seed, key)%uint64(len(k.stripes))]
	m.Lock()
	return m.Unlock
}

package postgres

import (
	"container/list"
	"encoding/hex"
	"sync"
	"time"

	"github.com/mulligan-gw/mulligan/store"
)

// keysChannel is the NOTIFY channel of evictions: its payload is the evicted key in hex. It
// travels on the wake-up listener's connection (listen.go).
const keysChannel = "mulligan_keys"

// Defaults of the replay cache (Options.ReplayCacheBytes, Options.ReplayCacheFor).
const (
	DefaultReplayCacheBytes = 32 << 20
	DefaultReplayCacheFor   = 5 * time.Second
)

// Keys longer than this are not cached: their eviction notice must fit a NOTIFY payload, and
// the gateway's own keys are 32-byte hashes.
const maxCachedKey = 256

// replayCache keeps the completed records this replica has read, so that replaying one costs
// no round trip (docs/backends.md, "Replays on PostgreSQL"). A completed record does not change
// until it expires or is evicted: expiry is checked on every hit; an eviction on any replica is
// announced on keysChannel and drops the entry here; and every entry lapses `ttl` after it was
// read, which bounds how long a lost notice can leave one stale. Entries are kept only while
// the listener is connected (notices can reach this replica), and a record read while a notice
// arrived (the generation moved) is not kept: it may be the one just evicted.
//
// A nil *replayCache caches nothing.
type replayCache struct {
	maxBytes int64
	ttl      time.Duration

	mu        sync.Mutex
	entries   map[string]*list.Element // of *cacheEntry
	order     *list.List               // most recently used first
	bytes     int64
	gen       uint64 // moves with every notice heard and every change of the listener's connection
	listening bool
}

type cacheEntry struct {
	key   string
	rec   *store.Record
	size  int64
	until time.Time // the sooner of the read plus ttl and the record's expiry
}

// newReplayCache is a cache of at most maxBytes whose entries lapse after ttl; nil when
// maxBytes is negative (caching off).
func newReplayCache(maxBytes int64, ttl time.Duration) *replayCache {
	if maxBytes < 0 {
		return nil
	}
	return &replayCache{maxBytes: maxBytes, ttl: ttl, entries: map[string]*list.Element{}, order: list.New()}
}

// get returns the cached record of key, live at now, or nil; the record is the caller's.
func (c *replayCache) get(key []byte, now time.Time) *store.Record {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[string(key)]
	if !ok {
		return nil
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.until) {
		c.remove(el)
		return nil
	}
	c.order.MoveToFront(el)
	return ownCopy(e.rec)
}

// ownCopy is rec with a header of its own: the cache and each caller hold separate ones (a
// replay writes the header into a response that later handlers may extend). The body is
// shared: nothing writes to it.
func ownCopy(rec *store.Record) *store.Record {
	cp := *rec
	resp := *rec.Response
	resp.Header = resp.Header.Clone()
	cp.Response = &resp
	return &cp
}

// generation is read before the database is: put keeps a record only if no notice came since.
func (c *replayCache) generation() uint64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// put keeps rec, read at now after generation returned gen, when it is a completed record
// that replays from its row alone (not a recorded stream, whose events are read each time).
func (c *replayCache) put(key []byte, rec *store.Record, gen uint64, now time.Time) {
	if c == nil || rec == nil || rec.State != store.Completed || rec.Streamed || rec.Response == nil || len(key) > maxCachedKey {
		return
	}
	e := &cacheEntry{key: string(key), rec: ownCopy(rec), size: recordSize(key, rec), until: now.Add(c.ttl)}
	if rec.ExpiresAt.Before(e.until) {
		e.until = rec.ExpiresAt
	}
	if e.size > c.maxBytes/16 || !now.Before(e.until) {
		return // one large answer must not empty the cache
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.listening || gen != c.gen {
		return
	}
	if el, ok := c.entries[e.key]; ok {
		c.remove(el)
	}
	c.entries[e.key] = c.order.PushFront(e)
	c.bytes += e.size
	for c.bytes > c.maxBytes {
		c.remove(c.order.Back())
	}
}

// recordSize approximates the memory a cached record holds.
func recordSize(key []byte, rec *store.Record) int64 {
	n := 256 + len(key) + len(rec.Fingerprint) + len(rec.OperationID) + len(rec.Response.Body)
	for k, vs := range rec.Response.Header {
		n += len(k)
		for _, v := range vs {
			n += len(v) + 16
		}
	}
	return int64(n)
}

func (c *replayCache) remove(el *list.Element) {
	e := c.order.Remove(el).(*cacheEntry)
	delete(c.entries, e.key)
	c.bytes -= e.size
}

// evicted drops key, on this replica's own eviction or a notice of another's.
func (c *replayCache) evicted(key []byte) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if el, ok := c.entries[string(key)]; ok {
		c.remove(el)
	}
}

// heard handles a notice on keysChannel.
func (c *replayCache) heard(payload string) {
	key, err := hex.DecodeString(payload)
	if err != nil {
		c.reset(true) // not ours to read: drop everything rather than guess
		return
	}
	c.evicted(key)
}

// reset empties the cache when the listener connects (notices may have been lost while it was
// away) and when it disconnects (none can arrive until it is back); only while listening does
// the cache keep anything.
func (c *replayCache) reset(listening bool) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.listening = listening
	clear(c.entries)
	c.order.Init()
	c.bytes = 0
}

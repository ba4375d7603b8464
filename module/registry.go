package module

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
)

// registry is what outlives one config: the open storages, each with the runner, courier and
// batch worker on it, and the seat pools of the capacity blocks. A reload's new App and
// handlers join what the old config opened through it, and each closes when the last config
// (and the last request) using it lets go (caddy.UsagePool: this is how Caddy's acmeserver
// keeps its database).
//
// The configs Caddy loads share one, caddyRegistry; a test gives an App one of its own. The App
// hands it to its blocks and storages, and they hand each service what it needs through its
// options (a seat pool's OnFree, a runner's Capacity): no service reaches it.
type registry struct {
	storages *caddy.UsagePool // storageSpec.poolKey -> *storage
	// seats: seatPoolKey -> *seatPool. A call that started under the old config keeps its seat
	// through a reload, and the new config's calls count against the same seats
	// (docs/capacity.md).
	seats *caddy.UsagePool
}

func newRegistry() *registry {
	return &registry{storages: caddy.NewUsagePool(), seats: caddy.NewUsagePool()}
}

// caddyRegistry is the registry of the configs Caddy loads. The admin API and the metrics
// collectors, which Caddy registers once per process, read it.
var caddyRegistry = newRegistry()

// openStorage returns the storage under key with one more user, opening it with open when no
// config holds it.
func (r *registry) openStorage(key string, open func() (*storage, error)) (*storage, error) {
	opener := func() (caddy.Destructor, error) { return open() }
	v, _, err := r.storages.LoadOrNew(key, opener)
	if errors.Is(err, errStorageClosed) {
		// A straggling request of an older config looked for it in the same instant.
		v, _, err = r.storages.LoadOrNew(key, opener)
	}
	if err != nil {
		return nil, err
	}
	return v.(*storage), nil
}

// acquireStorage returns the open storage under key with one more user, and the function that
// lets it go. It never opens one: that is the config's App's job at Start.
func (r *registry) acquireStorage(key string) (*storage, func(), error) {
	v, _, err := r.storages.LoadOrNew(key, func() (caddy.Destructor, error) { return nil, errStorageClosed })
	if err != nil {
		return nil, nil, err
	}
	return v.(*storage), func() { r.releaseStorage(key) }, nil
}

// releaseStorage lets go of one use of the storage under key; the last closes it.
func (r *registry) releaseStorage(key string) { _, _ = r.storages.Delete(key) }

// eachStorage calls fn with every open storage, and its pool key, until fn returns false.
func (r *registry) eachStorage(fn func(key string, s *storage) bool) {
	r.storages.Range(func(k, v any) bool {
		s, ok := v.(*storage)
		return !ok || fn(k.(string), s)
	})
}

// storagesAt lists the open handles on the storage at where (two while a reload that changed
// how it is opened overlaps the old config), with their pool keys.
func (r *registry) storagesAt(where string) (keys []string, open []*storage) {
	r.eachStorage(func(key string, s *storage) bool {
		if s.set.where() == where {
			keys, open = append(keys, key), append(open, s)
		}
		return true
	})
	return keys, open
}

// joinSeatPool returns the seats under key with one more user, made with create when no block
// has them.
func (r *registry) joinSeatPool(key string, create func() *seatPool) (*seatPool, error) {
	v, _, err := r.seats.LoadOrNew(key, func() (caddy.Destructor, error) { return create(), nil })
	if err != nil {
		return nil, err
	}
	return v.(*seatPool), nil
}

// releaseSeatPool lets go of one use of the seats under key; calls holding one keep it.
func (r *registry) releaseSeatPool(key string) { _, _ = r.seats.Delete(key) }

// seatPool returns the seats under key, nil when no block has them.
func (r *registry) seatPool(key string) *seatPool {
	var found *seatPool
	r.seats.Range(func(k, v any) bool {
		if k == key {
			found, _ = v.(*seatPool)
			return false
		}
		return true
	})
	return found
}

// seatPoolsAt lists the seat pools whose operations the storage at where holds; every pool
// when where is "".
func (r *registry) seatPoolsAt(where string) []*seatPool {
	var pools []*seatPool
	r.seats.Range(func(_, v any) bool {
		if p, ok := v.(*seatPool); ok && (where == "" || p.where == where) {
			pools = append(pools, p)
		}
		return true
	})
	return pools
}

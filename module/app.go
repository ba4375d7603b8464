package module

import (
	"sort"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/runner"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the process-level side of Mulligan in one config: the storages the config's handlers
// name, checked against each other at load, and held from Start to Cleanup. A storage (and its
// runner and courier) is shared by every block and every config naming it, through the
// registry (registry.go); per-block settings travel with each operation instead.
//
// Opening at Start rather than in Provision keeps `caddy validate` (which provisions but never
// starts) away from a running gateway's database. Letting go in Cleanup, which Caddy runs after
// every app of the old config has stopped, keeps the storage open for the old server's last
// requests.
//
// Handlers add it to the config themselves; it has nothing to configure.
type App struct {
	ctx  caddy.Context
	log  *zap.Logger
	mu   *sync.Mutex
	refs map[string]*storageRef // by storage (backend and location)
	reg  *registry              // what outlives the config: caddyRegistry, or a test's own
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "mulligan", New: func() caddy.Module {
		return &App{mu: new(sync.Mutex), refs: map[string]*storageRef{}, reg: caddyRegistry}
	}}
}

// Provision keeps the config's context, to find its HTTP servers at Start.
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx, a.log = ctx, ctx.Logger()
	return nil
}

// use records a block's reference to its storage, refusing one that conflicts with another block's.
func (a *App) use(b blockSpec) (*storageRef, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	u := a.refs[b.set.where()]
	if u == nil {
		u = newStorageRef(a.reg, b.set, a.log)
		a.refs[b.set.where()] = u
	}
	return u, u.join(b)
}

// Start opens (or joins) every storage the config's blocks name and hands each runner the
// config's servers and storage-wide settings.
func (a *App) Start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.refs) == 0 {
		return nil
	}
	httpApp, err := a.ctx.App("http")
	if err != nil {
		return err
	}
	servers, grace := httpApp.(*caddyhttp.App).Servers, time.Duration(httpApp.(*caddyhttp.App).GracePeriod)
	return a.startLocked(serverDispatch(servers), grace)
}

// startLocked opens (or joins) the storages with dispatch as what their runners' attempts go
// through; a.mu is held.
func (a *App) startLocked(dispatch runner.Dispatcher, grace time.Duration) error {
	wheres := make([]string, 0, len(a.refs))
	for w := range a.refs {
		wheres = append(wheres, w)
	}
	sort.Strings(wheres)
	for _, w := range wheres {
		u := a.refs[w]
		key := u.set.poolKey()
		s, err := a.reg.openStorage(key, func() (*storage, error) { return openStorage(a.reg, u.set, a.log) })
		if err != nil {
			a.releaseLocked()
			return err
		}
		u.open = s
		s.run.Configure(a, runnerConfig(u.set.concurrency, u.set.takeover, grace, dispatch, u.endpoints))
		u.key = key
		close(u.ready)
	}
	return nil
}

// Stop leaves the storages open: Cleanup lets go of them once the old config's servers have
// stopped taking requests.
func (a *App) Stop() error { return nil }

// Cleanup lets go of the config's storages; each closes when nothing else holds it.
func (a *App) Cleanup() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked()
	return nil
}

func (a *App) releaseLocked() {
	for _, u := range a.refs {
		if u.open != nil {
			u.open.run.Release(a)
			a.reg.releaseStorage(u.key)
			u.open = nil
		}
		select {
		case <-u.ready:
		default:
			close(u.ready) // never started: its requests get 503 instead of waiting
		}
	}
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
	_ caddy.Module       = (*App)(nil)
)

package module

import (
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the process-level side of Mulligan: it opens the stores the handlers of a config use
// when the config starts. Opening at Start rather than in Provision keeps `caddy validate` (which
// provisions but never starts) away from a running gateway's database, and the store package's
// shared handles let a reloaded config open the directory the old one still holds. Each handler
// closes its store in Cleanup, which Caddy runs after every app of the old config has stopped,
// so the old server's last requests still find their store open.
//
// Handlers add it to the config themselves; it has nothing to configure.
type App struct {
	mu    *sync.Mutex
	ctx   caddy.Context
	slots []*storeSlot
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "mulligan", New: func() caddy.Module { return &App{mu: new(sync.Mutex)} }}
}

// Provision keeps the config's context, to find its HTTP servers at Start.
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx = ctx
	return nil
}

// Start opens every store the config's handlers asked for, and hands the config's HTTP servers
// to their runners.
func (a *App) Start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var servers map[string]*caddyhttp.Server
	var grace time.Duration
	if len(a.slots) > 0 {
		httpApp, err := a.ctx.App("http")
		if err != nil {
			return err
		}
		servers, grace = httpApp.(*caddyhttp.App).Servers, time.Duration(httpApp.(*caddyhttp.App).GracePeriod)
	}
	for i, s := range a.slots {
		s.settings.grace = grace
		if err := s.open(servers); err != nil {
			for _, opened := range a.slots[:i] {
				opened.close()
			}
			return err
		}
	}
	return nil
}

// Stop leaves the stores open: the handlers close them in Cleanup, once the old config's
// servers have stopped taking requests.
func (a *App) Stop() error { return nil }

// reserve registers a store (and its runner) to open when the config starts.
func (a *App) reserve(opts store.Options, set runnerSettings, log *zap.Logger) *storeSlot {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := &storeSlot{opts: opts, settings: set, log: log, ready: make(chan struct{})}
	a.slots = append(a.slots, s)
	return s
}

// storeSlot is a store that opens when the config starts. Requests hold it while they use it:
// when the config stops (a reload), the handle closes after the last of its requests finishes,
// so a keyed call that straddles a reload still records its response.
type storeSlot struct {
	opts     store.Options
	settings runnerSettings
	log      *zap.Logger
	ready    chan struct{}

	mu      sync.Mutex
	st      *store.Store
	run     *runner
	users   int
	closing bool
}

func (s *storeSlot) open(servers map[string]*caddyhttp.Server) error {
	st, err := store.Open(s.opts)
	if err != nil {
		return fmt.Errorf("mulligan: %w", err)
	}
	run, err := acquireRunner(s.opts, s.settings, servers, s.log)
	if err != nil {
		_ = st.Close()
		return fmt.Errorf("mulligan: starting the runner: %w", err)
	}
	s.st, s.run = st, run
	close(s.ready)
	return nil
}

// shut releases the runner and the store handle; s.mu is held.
func (s *storeSlot) shut() error {
	if s.st == nil {
		return nil
	}
	s.run.release()
	return s.st.Close()
}

func (s *storeSlot) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil
	}
	s.closing = true
	if s.users == 0 {
		return s.shut()
	}
	return nil
}

// storeStartWait bounds how long a request that arrives while its config is still starting
// waits for the store.
const storeStartWait = 10 * time.Second

// acquire returns the store and its runner once they are open, and the function that gives them
// back. Apps start in no fixed order, so a request can reach a handler a moment before its store
// is open.
func (s *storeSlot) acquire() (*store.Store, *runner, func(), error) {
	select {
	case <-s.ready:
	default:
		t := time.NewTimer(storeStartWait)
		defer t.Stop()
		select {
		case <-s.ready:
		case <-t.C:
			return nil, nil, nil, store.ErrUnavailable
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing && s.users == 0 {
		return s.straggler()
	}
	s.users++
	return s.st, s.run, s.releaseUser, nil
}

// straggler serves a request that reached this config after its handles were given back (a
// reload whose grace period ran out with the request's connection still open): on a handle of
// its own and the runner the newer config runs, as long as there is one.
func (s *storeSlot) straggler() (*store.Store, *runner, func(), error) {
	run := liveRunner(s.opts.Dir)
	if run == nil {
		return nil, nil, nil, store.ErrClosed
	}
	st, err := store.Open(s.opts)
	if err != nil {
		run.release()
		return nil, nil, nil, err
	}
	return st, run, func() { _ = st.Close(); run.release() }, nil
}

func (s *storeSlot) releaseUser() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users--
	if s.closing && s.users == 0 {
		_ = s.shut()
	}
}

// Interface guards
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
	_ caddy.Module      = (*App)(nil)
)

package module

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/internal/idemkey"
	"github.com/mulligan-gw/mulligan/internal/opview"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/store"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI serves Mulligan's operator routes on Caddy's admin endpoint, under /mulligan/:
//
//	GET  /mulligan/stats                              queue, runs, outbox, breakers, endpoints
//	GET  /mulligan/dead-letters?after=&limit=         dead-lettered webhook events
//	POST /mulligan/dead-letters/redeliver             redeliver every dead letter
//	POST /mulligan/dead-letters/{event id}/redeliver  redeliver one
//	GET  /mulligan/attempts                           the latest delivery attempts
//	POST /mulligan/endpoints/{name}/enable            re-enable an endpoint disabled by a 410
//	GET  /mulligan/operations?status=&limit=&after=   operations of every scope, newest first
//	POST /mulligan/keys/evict                         forget an idempotency key: {"scope", "method", "path", "key"}
//
// With several storages in use, ?storage=<the name stats shows: directory or postgres://user@host:port/db> picks one.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.mulligan", New: func() caddy.Module { return new(AdminAPI) }}
}

// Routes returns the admin routes.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/mulligan/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

func (a *AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	run, err := runnerFor(r.URL.Query().Get("storage"))
	if err != nil {
		return err
	}
	parts := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, "/mulligan/"), "/"), "/")
	route := func(method string, shape ...string) bool {
		if r.Method != method || len(parts) != len(shape) {
			return false
		}
		for i, p := range shape {
			if p != "*" && p != parts[i] {
				return false
			}
		}
		return true
	}
	switch {
	case route("GET", "stats"):
		return adminJSON(w, run.Stats())
	case route("GET", "dead-letters"):
		return a.deadLetters(w, r, run)
	case route("POST", "dead-letters", "redeliver"):
		return a.redeliverAll(w, run)
	case route("POST", "dead-letters", "*", "redeliver"):
		return a.redeliver(w, run, parts[1])
	case route("GET", "attempts"):
		return adminJSON(w, map[string]any{"attempts": run.Courier().RecentAttempts()})
	case route("POST", "endpoints", "*", "enable"):
		return a.enable(w, run, parts[1])
	case route("GET", "operations"):
		return a.operations(w, r, run)
	case route("POST", "keys", "evict"):
		return a.evict(w, r, run)
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no such mulligan admin route: %s %s", r.Method, r.URL.Path)}
}

// runnerFor returns the runner of the storage named name (its directory, or its database as
// storageSpec.name shows it), or the only one when name is empty.
func runnerFor(name string) (*runner.Runner, error) {
	byName := map[string]*runner.Runner{}
	caddyRegistry.eachStorage(func(_ string, s *storage) bool {
		byName[s.set.name()] = s.run
		return true
	})
	if name != "" {
		if r := byName[name]; r != nil {
			return r, nil
		}
		return nil, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no mulligan storage at %s", name)}
	}
	names := make([]string, 0, len(byName))
	for n, r := range byName {
		if len(byName) == 1 {
			return r, nil
		}
		names = append(names, n)
	}
	if len(names) == 0 {
		return nil, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no mulligan storage is open")}
	}
	sort.Strings(names)
	return nil, caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("%d mulligan storages are open; pick one with ?storage= (%s)", len(names), strings.Join(names, ", "))}
}

func adminJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

func storeFailure(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: err}
	}
	return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
}

func (a *AdminAPI) deadLetters(w http.ResponseWriter, r *http.Request, run *runner.Runner) error {
	limit, err := strconv.Atoi(r.URL.Query().Get("limit"))
	if err != nil || limit < 1 || limit > 1000 {
		limit = 100
	}
	events, err := run.Store().DeadLetters(r.URL.Query().Get("after"), limit)
	if err != nil {
		return storeFailure(err)
	}
	return adminJSON(w, map[string]any{"dead_letters": events})
}

// redeliver answers the courier's redelivery of dead letter id.
func (a *AdminAPI) redeliver(w http.ResponseWriter, run *runner.Runner, id string) error {
	ev, err := run.Courier().Redeliver(id)
	if err != nil {
		return storeFailure(err)
	}
	return adminJSON(w, ev)
}

// redeliverAll answers the courier's redelivery of every dead letter.
func (a *AdminAPI) redeliverAll(w http.ResponseWriter, run *runner.Runner) error {
	n, err := run.Courier().RedeliverAll()
	if err != nil {
		return storeFailure(err)
	}
	return adminJSON(w, map[string]any{"redelivering": n})
}

// enable answers the courier's re-enabling of endpoint name.
func (a *AdminAPI) enable(w http.ResponseWriter, run *runner.Runner, name string) error {
	n, err := run.Courier().Enable(name)
	if err != nil {
		return storeFailure(err)
	}
	return adminJSON(w, map[string]any{"endpoint": name, "enabled": true, "events_due": n})
}

// operations lists operations across scopes, in the same form clients see.
func (a *AdminAPI) operations(w http.ResponseWriter, r *http.Request, run *runner.Runner) error {
	q := r.URL.Query()
	status := store.Status(q.Get("status"))
	if status != "" && !status.Valid() {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("unknown status %q", status)}
	}
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil || limit < 1 || limit > 1000 {
		limit = 100
	}
	ops, next, err := run.Store().ListAllOperations(status, q.Get("after"), limit)
	if err != nil {
		return storeFailure(err)
	}
	views := make([]opview.View, 0, len(ops))
	for _, op := range ops {
		views = append(views, opview.Of(execOf(op).Prefix, op, nil, run.Clock().Now()))
	}
	return adminJSON(w, map[string]any{"operations": views, "next_after": next})
}

// evict forgets one idempotency key, named as a request names it: its raw scope value (hashed
// here, as the gateway does), method, path and key.
func (a *AdminAPI) evict(w http.ResponseWriter, r *http.Request, run *runner.Runner) error {
	var k struct{ Scope, Method, Path, Key string }
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&k); err != nil || k.Method == "" || k.Path == "" || k.Key == "" {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf(`send {"scope":"...","method":"POST","path":"/v1/...","key":"..."}`)}
	}
	found, err := run.Store().EvictKey(idemkey.Record(k.Scope, strings.ToUpper(k.Method), k.Path, k.Key))
	if err != nil {
		return storeFailure(err)
	}
	return adminJSON(w, map[string]any{"evicted": found})
}

// Interface guards
var (
	_ caddy.Module      = (*AdminAPI)(nil)
	_ caddy.AdminRouter = (*AdminAPI)(nil)
)

package module

import (
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mulligan-gw/mulligan/store"
)

// dispatcher returns the handler an operation's attempts are sent through, or nil when the
// config serving now has none for it (the attempt then fails as an unreachable upstream). The
// runner is handed one with each config; in production it is serverDispatch over the config's
// Caddy servers, and a test hands it any http.Handler, so the runner runs without Caddy.
type dispatcher func(op *store.Operation) http.Handler

// serverDispatch sends each operation through the server of servers that accepted it (see
// serverFor).
func serverDispatch(servers map[string]*caddyhttp.Server) dispatcher {
	return func(op *store.Operation) http.Handler {
		if srv := serverFor(servers, op.Server); srv != nil {
			return srv
		}
		return nil // never a typed nil: the runner checks the interface
	}
}

// serverFor returns the server of servers an operation was accepted by: the one listening
// where it did (see serverID); failing that (the addresses changed, or differ per replica, or
// the operation was stored with a bare name), the server of the same name.
func serverFor(servers map[string]*caddyhttp.Server, id string) *caddyhttp.Server {
	listen, name, ok := strings.Cut(strings.TrimPrefix(id, serverIDPrefix), serverIDName)
	if !ok || !strings.HasPrefix(id, serverIDPrefix) {
		return servers[id]
	}
	for _, srv := range servers {
		if listenOf(srv) == listen {
			return srv
		}
	}
	return servers[name]
}

// The parts of a server's id.
const (
	serverIDPrefix = "listen:"
	serverIDName   = ";name:"
)

// serverID identifies a server across reloads and restarts by the addresses it listens on,
// and its name. The name alone will not do: the Caddyfile adapter numbers servers in order
// (srv0, srv1, ...), so a reload that adds a site ahead renames them, and an operation queued
// before would run through another site's routes and upstream.
func serverID(srv *caddyhttp.Server) string {
	return serverIDPrefix + listenOf(srv) + serverIDName + srv.Name()
}

func listenOf(srv *caddyhttp.Server) string {
	listen := slices.Clone(srv.Listen)
	slices.Sort(listen)
	return strings.Join(listen, ",")
}

// handlerFor returns what op's attempts go through under the newest config; nil before any
// config has started.
func (r *runner) handlerFor(op *store.Operation) http.Handler {
	if d := r.config().dispatch; d != nil {
		return d(op)
	}
	return nil
}

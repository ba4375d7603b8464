package module

import (
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/store"
)

// serverDispatch is the runner's dispatcher over a config's Caddy servers: it sends each operation through the server of servers that accepted it (see
// serverFor).
func serverDispatch(servers map[string]*caddyhttp.Server) runner.Dispatcher {
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

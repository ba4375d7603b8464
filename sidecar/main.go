// Command mulligan is Caddy with its standard modules and the Mulligan module: the ready
// gateway binary, for a sidecar container or a plain host. It takes Caddy's usual commands
// (`mulligan run --config Caddyfile`, `mulligan adapt`, `mulligan validate`, ...).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/mulligan-gw/mulligan/module"
)

func main() {
	caddycmd.Main()
}

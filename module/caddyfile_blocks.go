package module

import "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

// subdirectives parse a block's subdirectives by name, each from the dispenser on its name.
type subdirectives map[string]func(d *caddyfile.Dispenser) error

// unmarshalPrefixBlock reads a block that serves an API under a path prefix (the batches and
// responses blocks, docs/caddyfile.md):
//
//	name /v1 {
//		subdirective args...
//	}
//
// It sets *prefix and hands each subdirective to its parser in subs; one not in subs is an error.
func unmarshalPrefixBlock(d *caddyfile.Dispenser, name string, prefix *string, subs subdirectives) error {
	if !d.NextArg() {
		return d.Errf("%s needs the prefix to serve the API under, such as /v1", name)
	}
	*prefix = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		parse, ok := subs[d.Val()]
		if !ok {
			return d.Errf("unrecognized %s subdirective %q", name, d.Val())
		}
		if err := parse(d); err != nil {
			return err
		}
	}
	return nil
}

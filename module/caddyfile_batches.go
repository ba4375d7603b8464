package module

import "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

// unmarshalCaddyfile reads
//
//	batches /v1 {
//		max_file_size   200MiB
//		max_requests    50000
//		max_scope_bytes 1GiB
//		max_scope_files 100
//	}
func (c *BatchesConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("batches needs the prefix to serve the API under, such as /v1")
	}
	c.Prefix = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "max_file_size":
			err = sizeArg(d, &c.MaxFileSize)
		case "max_requests":
			err = intArg(d, &c.MaxRequests, 1)
		case "max_scope_bytes":
			err = sizeArg(d, &c.MaxScopeBytes)
		case "max_scope_files":
			err = intArg(d, &c.MaxScopeFiles, 1)
		default:
			err = d.Errf("unrecognized batches subdirective %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

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
	return unmarshalPrefixBlock(d, "batches", &c.Prefix, subdirectives{
		"max_file_size":   func(d *caddyfile.Dispenser) error { return sizeArg(d, &c.MaxFileSize) },
		"max_requests":    func(d *caddyfile.Dispenser) error { return intArg(d, &c.MaxRequests, 1) },
		"max_scope_bytes": func(d *caddyfile.Dispenser) error { return sizeArg(d, &c.MaxScopeBytes) },
		"max_scope_files": func(d *caddyfile.Dispenser) error { return intArg(d, &c.MaxScopeFiles, 1) },
	})
}

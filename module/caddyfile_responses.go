package module

import "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

// unmarshalCaddyfile reads
//
//	responses /v1 {
//		retention  24h
//		urgency    5
//		timeout    10m
//		max_result 32MiB
//	}
func (c *ResponsesConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalPrefixBlock(d, "responses", &c.Prefix, subdirectives{
		"retention":  func(d *caddyfile.Dispenser) error { return durationArg(d, &c.Retention) },
		"urgency":    func(d *caddyfile.Dispenser) error { return urgencyArg(d, &c.Urgency) },
		"timeout":    func(d *caddyfile.Dispenser) error { return durationArg(d, &c.Timeout) },
		"max_result": func(d *caddyfile.Dispenser) error { return sizeArg(d, &c.MaxResult) },
	})
}

// urgencyArg reads an urgency from 0 to 7 into *u.
func urgencyArg(d *caddyfile.Dispenser, u **int) error {
	var v int
	err := intArg(d, &v, 0)
	if err == nil && v > 7 {
		err = d.Errf("urgency must be from 0 to 7, got %d", v)
	}
	*u = &v
	return err
}

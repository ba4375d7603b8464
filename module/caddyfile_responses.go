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
	if !d.NextArg() {
		return d.Errf("responses needs the prefix to serve the API under, such as /v1")
	}
	c.Prefix = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "retention":
			err = durationArg(d, &c.Retention)
		case "urgency":
			var u int
			if err = intArg(d, &u, 0); err == nil && u > 7 {
				err = d.Errf("urgency must be from 0 to 7, got %d", u)
			}
			c.Urgency = &u
		case "timeout":
			err = durationArg(d, &c.Timeout)
		case "max_result":
			err = sizeArg(d, &c.MaxResult)
		default:
			err = d.Errf("unrecognized responses subdirective %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

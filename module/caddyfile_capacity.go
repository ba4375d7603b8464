package module

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// unmarshalCaddyfile reads the capacity block:
//
//	capacity {
//		limit          <n> | auto <min> <max>
//		shared         <n>
//		wait           <duration>
//		max_queue_wait <duration>
//	}
func (c *CapacityConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "limit":
			err = c.unmarshalLimit(d)
		case "shared":
			err = intArg(d, &c.Shared, 1)
		case "wait":
			err = durationArg(d, &c.Wait)
		case "max_queue_wait":
			err = durationArg(d, &c.MaxQueueWait)
		default:
			err = d.Errf("unrecognized capacity subdirective %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalLimit reads "limit <n>" or "limit auto <min> <max>".
func (c *CapacityConfig) unmarshalLimit(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) == 1 {
		n, err := strconv.Atoi(args[0])
		if err != nil || n < 1 {
			return d.Errf("limit must be a whole number of at least 1, or auto <min> <max>, got %q", args[0])
		}
		c.Limit, c.Auto = n, false
		return nil
	}
	if len(args) != 3 || args[0] != "auto" {
		return d.Errf("limit takes a number, or auto <min> <max>")
	}
	lo, err := strconv.Atoi(args[1])
	hi, herr := strconv.Atoi(args[2])
	if err != nil || herr != nil || lo < 1 || hi < lo {
		return d.Errf("limit auto takes a minimum and a maximum, 1 <= min <= max, got %q %q", args[1], args[2])
	}
	c.Limit, c.Auto, c.Min, c.Max = 0, true, lo, hi
	return nil
}

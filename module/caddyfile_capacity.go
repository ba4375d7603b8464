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
//		pass_priority  vllm|sglang
//		server_metrics <url> [vllm|sglang|tgi|llamacpp] {
//			interval     <duration>
//			max_waiting  <n>
//			max_kv_cache <0..1>
//		}
//		fair_key       <placeholder>
//		class <name> {
//			header  <field> [<value>]
//			urgency <0..7>
//			weight  <n>
//		}
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
		case "fair_key":
			err = oneArg(d, &c.FairKey)
		case "pass_priority":
			err = oneArg(d, &c.PassPriority)
		case "server_metrics":
			err = c.unmarshalServerMetrics(d)
		case "class":
			err = c.unmarshalClass(d)
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

// unmarshalClass reads "class <name> { header <field> [<value>]; urgency <n>; weight <n> }".
func (c *CapacityConfig) unmarshalClass(d *caddyfile.Dispenser) error {
	var cl CapacityClass
	if !d.NextArg() {
		return d.Errf("class needs a name")
	}
	cl.Name = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "header":
			args := d.RemainingArgs()
			if len(args) < 1 || len(args) > 2 {
				return d.Errf("class %s: header takes a field name and an optional value", cl.Name)
			}
			cl.Header = args[0]
			if len(args) == 2 {
				cl.Value = args[1]
			}
		case "urgency":
			var u int
			if err := intArg(d, &u, 0); err != nil {
				return err
			}
			cl.Urgency = &u
		case "weight":
			var s string
			if err := oneArg(d, &s); err != nil {
				return err
			}
			w, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return d.Errf("class %s: weight must be a number, got %q", cl.Name, s)
			}
			cl.Weight = w
		default:
			return d.Errf("unrecognized class subdirective %q", d.Val())
		}
	}
	if err := cl.Validate(); err != nil {
		return d.Err(err.Error())
	}
	c.Classes = append(c.Classes, cl)
	return nil
}

// unmarshalServerMetrics reads "server_metrics <url> [<server>] { interval; max_waiting;
// max_kv_cache }".
func (c *CapacityConfig) unmarshalServerMetrics(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return d.Errf("server_metrics takes the endpoint's URL and, optionally, the server: vllm, sglang, tgi or llamacpp")
	}
	m := &ServerMetricsConfig{URL: args[0]}
	if len(args) == 2 {
		m.Server = args[1]
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "interval":
			err = durationArg(d, &m.Interval)
		case "max_waiting", "max_kv_cache":
			name := d.Val()
			var s string
			if err = oneArg(d, &s); err != nil {
				return err
			}
			v, perr := strconv.ParseFloat(s, 64)
			if perr != nil {
				return d.Errf("server_metrics: %s must be a number, got %q", name, s)
			}
			if name == "max_waiting" {
				m.MaxWaiting = &v
			} else {
				m.MaxKVCache = v
			}
		default:
			err = d.Errf("unrecognized server_metrics subdirective %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	c.ServerMetrics = m
	return nil
}

package module

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/mulligan-gw/mulligan/webhook"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("mulligan", parseCaddyfile)
	// After authentication and encode (so recorded responses are the upstream's, compressed per
	// client on the way out), before reverse_proxy, which it guards.
	httpcaddyfile.RegisterDirectiveOrder("mulligan", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	mulligan {
//		storage        [badger] <dir> | postgres <dsn> [{
//			direct              <dsn>  (postgres)
//			memtable_size       <size> (badger, each below: docs/backends.md)
//			memtables           <n>
//			block_cache         <size>
//			index_cache         <size>
//			value_log_file_size <size>
//		}]
//		encryption_key <key>
//		scope          <placeholder template>|<constant, e.g. shared>
//		operations     <path prefix>
//		durability     sync|relaxed
//		idempotency {
//			methods            <method...>
//			header             <name>
//			required
//			ttl                <duration>
//			lease              <duration>
//			max_body           <size>
//			max_buffered       <size>
//			fingerprint_ignore <json pointer...>
//			mismatch_status    409|422
//			wait_inflight      <duration>
//			store_status       <class or code...>
//		}
//		async {
//			mode        prefer|always|after <duration>
//			concurrency <n>
//			queue       <n>
//			timeout     <duration>
//			retries     <n>
//			retention   <duration>
//			max_result  <size>
//			on_crash    requeue|fail
//			takeover    <duration>
//			type        <name>
//			retry_on    <status...>
//			max_per_scope <n>
//		}
//		capacity {
//			limit          <n> | auto <min> <max>
//			shared         <n>
//			wait           <duration>
//			max_queue_wait <duration>
//			server_metrics <url> [vllm|sglang|tgi|llamacpp] {
//				interval     <duration>
//				max_waiting  <n>
//				max_kv_cache <0..1>
//			}
//			fair_key       <placeholder>
//			class <name> {
//				header  <field> [<value>]
//				urgency <0..7>
//				weight  <n>
//			}
//			pass_priority  vllm|sglang
//		}
//		webhooks {
//			endpoint <name> <url or pattern> {
//				secret    <whsec_...> [<whsec_...>...]
//				signature standard-webhooks|x-webhook
//			}
//			default      <endpoint name>
//			events       <event type...>
//			timeout      <duration>
//			max_attempts <n>
//			max_age      <duration>
//			breaker      <failures> <cooldown>
//			backoff      <min> <max>
//			allow_private
//		}
//	}
func (m *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		var err error
		switch d.Val() {
		case "storage":
			err = m.unmarshalStorage(d)
		case "encryption_key":
			err = oneArg(d, &m.EncryptionKey)
		case "scope":
			err = oneArg(d, &m.Scope)
		case "operations":
			err = oneArg(d, &m.Operations)
		case "durability":
			err = oneArg(d, &m.Durability)
			if err == nil && m.Durability != DurabilitySync && m.Durability != DurabilityRelaxed {
				err = d.Errf("durability must be sync or relaxed, got %q", m.Durability)
			}
		case "idempotency":
			m.Idempotency = new(IdempotencyConfig)
			err = m.Idempotency.unmarshalCaddyfile(d)
		case "async":
			if m.Async == nil {
				m.Async = new(AsyncConfig)
			}
			err = m.Async.unmarshalCaddyfile(d)
		case "webhooks":
			m.Webhooks = new(WebhooksConfig)
			err = m.Webhooks.unmarshalCaddyfile(d)
		case "capacity":
			m.Capacity = new(CapacityConfig)
			err = m.Capacity.unmarshalCaddyfile(d)
		case "batches":
			m.Batches = new(BatchesConfig)
			err = m.Batches.unmarshalCaddyfile(d)
		case "responses":
			m.Responses = new(ResponsesConfig)
			err = m.Responses.unmarshalCaddyfile(d)
		default:
			err = d.Errf("unrecognized mulligan subdirective %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalStorage reads `storage <dir>`, `storage badger <dir>` or `storage postgres <dsn>`,
// the last with an optional block naming the direct DSN (`direct <dsn>`), the first two with
// an optional block sizing Badger's memory.
func (m *Handler) unmarshalStorage(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	postgres := len(args) == 2 && args[0] == BackendPostgres
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if d.Val() == "direct" {
			if !postgres {
				return d.Errf("direct applies to storage postgres <dsn> only")
			}
			if err := oneArg(d, &m.StorageDirect); err != nil {
				return err
			}
			continue
		}
		if postgres {
			return d.Errf("unrecognized storage option %q (storage postgres takes direct <dsn>)", d.Val())
		}
		if err := m.unmarshalBadgerMemory(d); err != nil {
			return err
		}
	}
	switch {
	case len(args) == 1:
		m.StorageBackend, m.Storage = "", args[0]
	case len(args) == 2 && (args[0] == BackendBadger || args[0] == BackendPostgres):
		m.StorageBackend, m.Storage = args[0], args[1]
	case len(args) == 2:
		return d.Errf("storage backend must be %s or %s, got %q", BackendBadger, BackendPostgres, args[0])
	default:
		return d.Errf("storage takes a Badger directory, or badger <dir>, or postgres <dsn>")
	}
	return nil
}

// unmarshalBadgerMemory reads one of `storage badger`'s memory settings (docs/backends.md).
func (m *Handler) unmarshalBadgerMemory(d *caddyfile.Dispenser) error {
	if m.StorageMemory == nil {
		m.StorageMemory = new(BadgerMemory)
	}
	mem := m.StorageMemory
	switch d.Val() {
	case "memtable_size":
		return sizeArg(d, &mem.MemTableSize)
	case "memtables":
		return intArg(d, &mem.MemTables, 1)
	case "block_cache":
		return sizeArg(d, &mem.BlockCache)
	case "index_cache":
		return sizeArg(d, &mem.IndexCache)
	case "value_log_file_size":
		return sizeArg(d, &mem.ValueLogFileSize)
	}
	return d.Errf("unrecognized storage option %q (storage badger takes memtable_size, memtables, block_cache, index_cache, value_log_file_size)", d.Val())
}

func (c *IdempotencyConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "methods":
			c.Methods, err = someArgs(d)
		case "header":
			err = oneArg(d, &c.Header)
		case "required":
			if d.NextArg() {
				return d.ArgErr()
			}
			c.Required = true
		case "ttl":
			err = durationArg(d, &c.TTL)
		case "lease":
			err = durationArg(d, &c.Lease)
		case "max_body":
			err = sizeArg(d, &c.MaxBody)
		case "max_buffered":
			err = sizeArg(d, &c.MaxBuffered)
		case "fingerprint_ignore":
			var ptrs []string
			ptrs, err = someArgs(d)
			c.FingerprintIgnore = append(c.FingerprintIgnore, ptrs...)
		case "mismatch_status":
			var s string
			if err = oneArg(d, &s); err == nil {
				c.MismatchStatus, err = strconv.Atoi(s)
				if err != nil || (c.MismatchStatus != 409 && c.MismatchStatus != 422) {
					err = d.Errf("mismatch_status must be 409 or 422, got %q", s)
				}
			}
		case "wait_inflight":
			err = durationArg(d, &c.WaitInflight)
		case "store_status":
			c.StoreStatus, err = someArgs(d)
			if err == nil {
				if _, perr := parseStatusPolicy(c.StoreStatus); perr != nil {
					err = d.Err(perr.Error())
				}
			}
		default:
			err = d.Errf("unrecognized idempotency subdirective %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *AsyncConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "mode":
			err = c.unmarshalMode(d)
		case "concurrency":
			err = intArg(d, &c.Concurrency, 1)
		case "queue":
			err = intArg(d, &c.Queue, 1)
		case "timeout":
			err = durationArg(d, &c.Timeout)
		case "retries":
			c.Retries = new(int)
			err = intArg(d, c.Retries, 0)
		case "retention":
			err = durationArg(d, &c.Retention)
		case "max_result":
			err = sizeArg(d, &c.MaxResult)
		case "takeover":
			err = durationArg(d, &c.Takeover)
		case "type":
			err = oneArg(d, &c.Type)
		case "retry_on":
			c.RetryOn, err = statusArgs(d)
		case "max_per_scope":
			err = intArg(d, &c.MaxPerScope, 0)
		case "on_crash":
			err = oneArg(d, &c.OnCrash)
			if err == nil && c.OnCrash != CrashRequeue && c.OnCrash != CrashFail {
				err = d.Errf("on_crash must be requeue or fail, got %q", c.OnCrash)
			}
		default:
			err = d.Errf("unrecognized async subdirective %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *WebhooksConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "endpoint":
			err = c.unmarshalEndpoint(d)
		case "default":
			err = oneArg(d, &c.Default)
		case "events":
			c.Events, err = someArgs(d)
		case "timeout":
			err = durationArg(d, &c.Timeout)
		case "max_attempts":
			err = intArg(d, &c.MaxAttempts, 1)
		case "max_age":
			err = durationArg(d, &c.MaxAge)
		case "breaker":
			err = c.unmarshalBreaker(d)
		case "backoff":
			err = c.unmarshalBackoff(d)
		case "allow_private":
			if d.NextArg() {
				return d.ArgErr()
			}
			c.AllowPrivate = true
		default:
			err = d.Errf("unrecognized webhooks subdirective %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// twoArgs reads exactly two arguments.
func twoArgs(d *caddyfile.Dispenser) (string, string, error) {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return "", "", d.ArgErr()
	}
	return args[0], args[1], nil
}

// unmarshalBreaker reads "breaker <failures> <cooldown>".
func (c *WebhooksConfig) unmarshalBreaker(d *caddyfile.Dispenser) error {
	failures, cooldown, err := twoArgs(d)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(failures)
	dur, derr := caddy.ParseDuration(cooldown)
	if err != nil || n < 1 || derr != nil || dur <= 0 {
		return d.Errf("breaker takes a number of failures and a cooldown, like: breaker 5 30s")
	}
	c.BreakerFailures, c.BreakerCooldown = n, caddy.Duration(dur)
	return nil
}

// unmarshalBackoff reads "backoff <min> <max>".
func (c *WebhooksConfig) unmarshalBackoff(d *caddyfile.Dispenser) error {
	lo, hi, err := twoArgs(d)
	if err != nil {
		return err
	}
	minWait, err := caddy.ParseDuration(lo)
	maxWait, merr := caddy.ParseDuration(hi)
	if err != nil || merr != nil || minWait <= 0 || maxWait < minWait {
		return d.Errf("backoff takes a minimum and a maximum wait, like: backoff 1s 10m")
	}
	c.BackoffMin, c.BackoffMax = caddy.Duration(minWait), caddy.Duration(maxWait)
	return nil
}

// unmarshalEndpoint reads "endpoint <name> <url> { secret <s>...; signature <style> }".
func (c *WebhooksConfig) unmarshalEndpoint(d *caddyfile.Dispenser) error {
	var ep EndpointConfig
	if !d.Args(&ep.Name, &ep.URL) || d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "secret":
			secrets, err := someArgs(d)
			if err != nil {
				return err
			}
			ep.Secrets = append(ep.Secrets, secrets...)
		case "signature":
			if err := oneArg(d, &ep.Signature); err != nil {
				return err
			}
			if _, err := webhook.ParseStyle(ep.Signature); err != nil {
				return d.Errf("endpoint %q: signature must be standard-webhooks or x-webhook, got %q", ep.Name, ep.Signature)
			}
		default:
			return d.Errf("unrecognized endpoint subdirective %q", d.Val())
		}
	}
	if len(ep.Secrets) == 0 {
		return d.Errf("endpoint %q needs a secret", ep.Name)
	}
	c.Endpoints = append(c.Endpoints, ep)
	return nil
}

// unmarshalMode reads "prefer", "always" or "after <duration>".
func (c *AsyncConfig) unmarshalMode(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	c.Mode = d.Val()
	switch c.Mode {
	case ModePrefer, ModeAlways:
		if d.NextArg() {
			return d.ArgErr()
		}
		return nil
	case ModeAfter:
		return durationArg(d, &c.After)
	}
	return d.Errf("mode must be prefer, always or after <duration>, got %q", c.Mode)
}

// intArg reads one whole number of at least min.
func intArg(d *caddyfile.Dispenser, dst *int, min int) error {
	name := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < min {
		return d.Errf("%s must be a whole number of at least %d, got %q", name, min, s)
	}
	*dst = n
	return nil
}

// statusArgs reads one or more HTTP statuses from 400 to 599.
func statusArgs(d *caddyfile.Dispenser) ([]int, error) {
	name := d.Val()
	args, err := someArgs(d)
	if err != nil {
		return nil, err
	}
	codes := make([]int, 0, len(args))
	for _, s := range args {
		n, err := strconv.Atoi(s)
		if err != nil || n < 400 || n > 599 {
			return nil, d.Errf("%s takes statuses from 400 to 599, got %q", name, s)
		}
		codes = append(codes, n)
	}
	return codes, nil
}

// oneArg reads exactly one argument.
func oneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// someArgs reads one or more arguments.
func someArgs(d *caddyfile.Dispenser) ([]string, error) {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return nil, d.ArgErr()
	}
	return args, nil
}

func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	name := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil || dur < 0 {
		return d.Errf("invalid duration %q for %s", s, name)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// sizeArg reads a byte size such as 16MiB or 1048576.
func sizeArg(d *caddyfile.Dispenser, dst *int64) error {
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := humanize.ParseBytes(strings.TrimSpace(s))
	if err != nil || n == 0 || n > 1<<40 {
		return d.Errf("invalid size %q: use a positive size such as 16MiB", s)
	}
	*dst = int64(n)
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)

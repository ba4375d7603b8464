package main

import (
	"net/url"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"

	"github.com/mulligan-gw/mulligan/internal/capacity"
)

// The capacity and batches blocks from MULLIGAN_CAPACITY_* and MULLIGAN_BATCHES* (docs/capacity.md,
// docs/batches.md): each block is written only when one of its variables is set, so the
// defaults give the Caddyfile they gave before.

// capacityBlock is the capacity block's checked values; "" (0 for Shared) leaves an option out.
type capacityBlock struct {
	Limit        string // "8" or "auto 1 64"
	Shared       int
	Wait         string
	MaxQueueWait string
	PassPriority string
	// ServerMetrics is the model server's metrics URL and its kind ("" when unset).
	ServerMetrics, ServerKind string
	FairKey                   string
}

// capacity reads the MULLIGAN_CAPACITY_* variables; nil when none is set. shared is refused
// unless postgres is: on Badger there is one replica, and the module refuses it at load.
func (r *envReader) capacity(postgres bool) *capacityBlock {
	names := []string{"MULLIGAN_CAPACITY_LIMIT", "MULLIGAN_CAPACITY_SHARED", "MULLIGAN_CAPACITY_WAIT", "MULLIGAN_CAPACITY_MAX_QUEUE_WAIT",
		"MULLIGAN_CAPACITY_PASS_PRIORITY", "MULLIGAN_CAPACITY_SERVER_METRICS", "MULLIGAN_CAPACITY_FAIR_KEY"}
	if !r.anySet(names...) {
		return nil
	}
	c := &capacityBlock{Limit: r.limit(names[0]), Wait: r.duration(names[2], true)}
	if r.set(names[1]) {
		c.Shared = r.count(names[1])
		if !postgres && r.ok(names[1]) {
			r.fail(names[1], "applies to PostgreSQL storage only (MULLIGAN_STORAGE=postgres://...): it bounds the calls of every replica on one database")
		}
	}
	if r.set(names[3]) {
		c.MaxQueueWait = r.duration(names[3], true)
	}
	if r.set(names[4]) {
		c.PassPriority = r.get(names[4])
		if c.PassPriority != "vllm" && c.PassPriority != "sglang" {
			r.fail(names[4], "must be vllm or sglang, got %q", c.PassPriority)
		}
	}
	if r.set(names[5]) {
		c.ServerMetrics, c.ServerKind = r.serverMetrics(names[5])
		if c.ServerMetrics != "" && c.Limit != "" && !strings.HasPrefix(c.Limit, "auto") {
			r.fail(names[5], "steers limit auto; MULLIGAN_CAPACITY_LIMIT is a fixed %s", c.Limit)
		}
	}
	if r.set(names[6]) {
		key := r.text(names[6])
		if err := capacity.ValidateFairKey(key); err != nil && r.ok(names[6]) {
			r.fail(names[6], "must be a placeholder such as {http.request.header.X-Tenant}, or text with placeholders whose braces pair, got %q", key)
		}
		c.FairKey = caddyfileToken(key)
	}
	return c
}

// serverMetrics is MULLIGAN_CAPACITY_SERVER_METRICS: an http(s) URL, then optionally the kind
// of server whose metric names to read.
func (r *envReader) serverMetrics(name string) (endpoint, kind string) {
	f := strings.Fields(r.get(name))
	if len(f) == 0 || len(f) > 2 {
		r.fail(name, "must be the metrics URL, then optionally vllm, sglang, tgi or llamacpp, got %q", r.get(name))
		return "", ""
	}
	u, err := url.Parse(f[0])
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		r.fail(name, "must start with an http:// or https:// URL with a host, got %q", f[0])
		return "", ""
	case strings.ContainsAny(f[0], "{}") || checkText(f[0]) != nil: // checkText: quotes, backslashes
		r.fail(name, "must be one URL, without braces, quotes or backslashes (percent-encode them)")
		return "", ""
	}
	kind = "vllm"
	if len(f) == 2 {
		kind = f[1]
	}
	switch kind {
	case "vllm", "sglang", "tgi", "llamacpp":
		return f[0], kind
	}
	r.fail(name, "names vllm, sglang, tgi or llamacpp after the URL, got %q", kind)
	return "", ""
}

// limit is "N" or "auto <min> <max>", "" when unset (the module's auto 1 64).
func (r *envReader) limit(name string) string {
	if !r.set(name) {
		return ""
	}
	v := r.get(name)
	f := strings.Fields(v)
	if len(f) == 1 {
		if n, err := strconv.Atoi(f[0]); err == nil && n >= 1 {
			return f[0]
		}
	}
	if len(f) == 3 && f[0] == "auto" {
		lo, err := strconv.Atoi(f[1])
		hi, herr := strconv.Atoi(f[2])
		if err == nil && herr == nil && lo >= 1 && hi >= lo {
			return strings.Join(f, " ")
		}
	}
	r.fail(name, "must be a whole number of at least 1, or auto <min> <max> with 1 <= min <= max (e.g. auto 1 64), got %q", v)
	return ""
}

func (c *capacityBlock) caddyfile(line func(depth int, words ...string)) {
	if c == nil {
		return
	}
	line(2, "capacity", "{")
	if c.Limit != "" {
		line(3, "limit", c.Limit)
	}
	if c.Shared > 0 {
		line(3, "shared", strconv.Itoa(c.Shared))
	}
	line(3, "wait", c.Wait)
	if c.MaxQueueWait != "" {
		line(3, "max_queue_wait", c.MaxQueueWait)
	}
	if c.PassPriority != "" {
		line(3, "pass_priority", c.PassPriority)
	}
	if c.ServerMetrics != "" {
		line(3, "server_metrics", c.ServerMetrics, c.ServerKind)
	}
	if c.FairKey != "" {
		line(3, "fair_key", c.FairKey)
	}
	line(2, "}")
}

// batchesBlock is the batches block's checked values.
type batchesBlock struct {
	Prefix      string
	MaxFileSize string
	MaxRequests int
}

// batches reads MULLIGAN_BATCHES and its options; nil when the API is off. An option set
// without MULLIGAN_BATCHES is refused: it would configure nothing.
func (r *envReader) batches() *batchesBlock {
	const name = "MULLIGAN_BATCHES"
	options := []string{"MULLIGAN_BATCHES_MAX_FILE_SIZE", "MULLIGAN_BATCHES_MAX_REQUESTS"}
	if !r.set(name) {
		for _, o := range options {
			if r.set(o) {
				r.fail(o, "is set without MULLIGAN_BATCHES (the prefix to serve the Files and Batches API under, e.g. /v1)")
			}
		}
		return nil
	}
	b := &batchesBlock{Prefix: r.path(name), MaxFileSize: r.size(options[0]), MaxRequests: r.count(options[1])}
	if b.Prefix != "" && strings.ContainsAny(b.Prefix, "*?#") {
		r.fail(name, "must be a plain path prefix such as /v1, got %q", b.Prefix)
	}
	return b
}

// size is a positive size such as 200MiB, at most 1 TiB (as the module's).
func (r *envReader) size(name string) string {
	v := r.get(name)
	n, err := humanize.ParseBytes(v)
	if err != nil || n == 0 || n > 1<<40 || strings.ContainsAny(v, " \t") {
		r.fail(name, "must be a positive size such as 200MiB or 1GB (no spaces), got %q", v)
		return ""
	}
	return v
}

func (b *batchesBlock) caddyfile(line func(depth int, words ...string)) {
	if b == nil {
		return
	}
	line(2, "batches", b.Prefix, "{")
	line(3, "max_file_size", b.MaxFileSize)
	line(3, "max_requests", strconv.Itoa(b.MaxRequests))
	line(2, "}")
}

// set reports whether name has a value (an empty one counts as unset).
func (r *envReader) set(name string) bool { return strings.TrimSpace(r.raw(name)) != "" }

// anySet reports whether any of names has a value.
func (r *envReader) anySet(names ...string) bool {
	for _, n := range names {
		if r.set(n) {
			return true
		}
	}
	return false
}

// storageName says in the start-up log where state is kept: the Badger directory, or
// PostgreSQL by the variable naming it (its URL holds a password).
func (c *sidecarConfig) storageName() string {
	if c.Storage != "" {
		return "postgres (MULLIGAN_STORAGE)"
	}
	return c.DataDir
}

// responsesBlock is the responses block's checked values (docs/responses.md).
type responsesBlock struct {
	Prefix    string
	Retention string
}

// responses reads MULLIGAN_RESPONSES and its retention; nil when the API is off. The retention
// set without MULLIGAN_RESPONSES is refused: it would configure nothing.
func (r *envReader) responses() *responsesBlock {
	const name, retention = "MULLIGAN_RESPONSES", "MULLIGAN_RESPONSES_RETENTION"
	if !r.set(name) {
		if r.set(retention) {
			r.fail(retention, "is set without MULLIGAN_RESPONSES (the prefix to serve the Responses API under, e.g. /v1)")
		}
		return nil
	}
	b := &responsesBlock{Prefix: r.path(name), Retention: r.duration(retention, true)}
	if b.Prefix != "" && strings.ContainsAny(b.Prefix, "*?#") {
		r.fail(name, "must be a plain path prefix such as /v1, got %q", b.Prefix)
	}
	return b
}

func (b *responsesBlock) caddyfile(line func(depth int, words ...string)) {
	if b == nil {
		return
	}
	line(2, "responses", b.Prefix, "{")
	line(3, "retention", b.Retention)
	line(2, "}")
}

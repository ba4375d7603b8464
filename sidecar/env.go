package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"unicode"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/mulligan-gw/mulligan/webhook"
)

// sidecarVar is one environment variable `mulligan sidecar` reads.
type sidecarVar struct {
	Name    string
	Default string // "" for none
	Meaning string
}

// sidecarVars is every variable `mulligan sidecar` reads, with its default: the one list the
// reader, `mulligan sidecar --help` and docs/operating.md's table come from. An empty value counts as
// unset.
var sidecarVars = []sidecarVar{
	{"MULLIGAN_UPSTREAM", "", "required: the model server, host:port or http://host:port (reverse_proxy)"},
	{"MULLIGAN_LISTEN", ":8080", "where the gateway listens, [host]:port; a host binds that interface only"},
	{"MULLIGAN_STORAGE", "", "postgres://user:pass@host:5432/db: every replica on one PostgreSQL (storage postgres); or a Badger directory, as MULLIGAN_DATA_DIR"},
	{"MULLIGAN_STORAGE_DIRECT", "", "with MULLIGAN_STORAGE behind PgBouncer: postgres://... of the same database without it, for migrations and LISTEN (storage postgres ... { direct })"},
	{"MULLIGAN_DATA_DIR", "/var/lib/mulligan", "the Badger directory (storage): operations and idempotency records"},
	{"MULLIGAN_ADMIN", "localhost:2019", "Caddy's admin endpoint (admin), or off"},
	{"MULLIGAN_GRACE_PERIOD", "30s", "how long requests in flight get to finish on SIGTERM (grace_period)"},
	{"MULLIGAN_DURABILITY", "sync", "sync (fsync before answering) or relaxed (durability)"},
	{"MULLIGAN_SCOPE", "", "tenant scope template; unset: {http.request.header.Authorization}; a constant such as shared: one scope for all (scope)"},
	{"MULLIGAN_OPERATIONS", "/v1/operations", "where operations are served (operations)"},
	{"MULLIGAN_ENCRYPTION_KEY", "", "encryption at rest, a 16/24/32-byte key: hex:<hex>, base64:<base64> or raw bytes (encryption_key)"},
	{"MULLIGAN_ENCRYPTION_KEY_FILE", "", "the same, read from a file (one trailing newline ignored)"},
	{"MULLIGAN_IDEMPOTENCY_REQUIRED", "false", "true: covered requests without a key get 400 (idempotency.required)"},
	{"MULLIGAN_IDEMPOTENCY_TTL", "24h", "how long a completed key replays (idempotency.ttl)"},
	{"MULLIGAN_WAIT_INFLIGHT", "0s", "how long a duplicate waits for the first answer (idempotency.wait_inflight)"},
	{"MULLIGAN_ASYNC_MODE", "prefer", "prefer, always or after <duration>, e.g. after 2s (async.mode)"},
	{"MULLIGAN_ASYNC_CONCURRENCY", "4", "queued operations calling the upstream at once (async.concurrency)"},
	{"MULLIGAN_ASYNC_TIMEOUT", "10m", "longest execution of one operation, retries included (async.timeout)"},
	{"MULLIGAN_ASYNC_QUEUE", "10000", "waiting operations before 503 QUEUE_FULL (async.queue)"},
	{"MULLIGAN_ASYNC_TAKEOVER", "30s", "a replica silent this long loses its running operations to the others (async.takeover)"},
	{"MULLIGAN_CAPACITY_LIMIT", "", "the model server's seats from this replica: N, or auto <min> <max>; any MULLIGAN_CAPACITY_* set turns capacity on, with auto 1 64 unless this says (capacity.limit)"},
	{"MULLIGAN_CAPACITY_SHARED", "", "PostgreSQL storage only: calls in flight from every replica on it together (capacity.shared)"},
	{"MULLIGAN_CAPACITY_WAIT", "30s", "longest a sync call waits for a seat, then 202 or 503 UPSTREAM_SATURATED (capacity.wait)"},
	{"MULLIGAN_CAPACITY_MAX_QUEUE_WAIT", "", "queued work older than this fails QUEUE_TIMEOUT without reaching the upstream; unset: no bound (capacity.max_queue_wait)"},
	{"MULLIGAN_CAPACITY_PASS_PRIORITY", "", "vllm or sglang: set the JSON body's priority field sent upstream to the trusted urgency in that server's scale; unset: off (capacity.pass_priority)"},
	{"MULLIGAN_CAPACITY_SERVER_METRICS", "", "the model server's Prometheus endpoint, an http(s) URL, then optionally vllm, sglang, tgi or llamacpp (default vllm): its own queue steers limit auto; unset: latency does (capacity.server_metrics)"},
	{"MULLIGAN_CAPACITY_FAIR_KEY", "", "who shares the seats fairly, e.g. {http.request.header.X-Tenant} set by the auth layer; unset: the scope (capacity.fair_key)"},
	{"MULLIGAN_BATCHES", "", "the Files and Batches API under this prefix, e.g. /v1; unset: off (batches)"},
	{"MULLIGAN_BATCHES_MAX_FILE_SIZE", "200MiB", "largest file uploaded for a batch (batches.max_file_size)"},
	{"MULLIGAN_BATCHES_MAX_REQUESTS", "50000", "most lines in a batch's input file (batches.max_requests)"},
	{"MULLIGAN_RESPONSES", "", "the Responses API's background mode under this prefix, e.g. /v1; unset: off (responses)"},
	{"MULLIGAN_RESPONSES_RETENTION", "24h", "how long a finished background response is kept (responses.retention)"},
	{"MULLIGAN_WEBHOOK_URL", "", "where final-status events go: one endpoint named default, the site default"},
	{"MULLIGAN_WEBHOOK_SECRET", "", "its signing secrets (whsec_...), whitespace-separated: several = rotation"},
	{"MULLIGAN_WEBHOOK_SECRET_FILE", "", "the same, read from a file (e.g. a mounted Kubernetes Secret)"},
	{"MULLIGAN_WEBHOOK_ALLOW_PRIVATE", "false", "true: the webhook URL may be loopback or private (webhooks.allow_private)"},
}

// sidecarConfig is the validated content of the MULLIGAN_* variables.
type sidecarConfig struct {
	Upstream string
	Port     string
	Bind     string // "" listens on every interface
	DataDir  string
	// Storage is the PostgreSQL DSN's placeholder, {env.MULLIGAN_STORAGE}, so the password is
	// never in the config; "" for Badger in DataDir.
	Storage string
	// StorageDirect is the direct DSN's placeholder, {env.MULLIGAN_STORAGE_DIRECT}; "" for none.
	StorageDirect string
	Admin         string
	GracePeriod   string

	Durability string
	Scope      string
	Operations string
	// EncryptionKey is a placeholder ({env.…} or {file.…}) that the module resolves when it
	// starts, so the key itself is never in the config (which the admin API serves).
	EncryptionKey string

	IdempotencyRequired bool
	IdempotencyTTL      string
	WaitInflight        string

	AsyncMode        string
	AsyncConcurrency int
	AsyncTimeout     string
	AsyncQueue       int
	AsyncTakeover    string

	// Capacity is the capacity block, nil without one; Batches the batches block, likewise.
	Capacity *capacityBlock
	Batches  *batchesBlock
	// Responses is the responses block, nil when the API is off.
	Responses *responsesBlock

	WebhookURL string
	// WebhookSecrets is a placeholder ({env.…} or {file.…}) too: the module expands it when it
	// starts and splits it into secrets at whitespace.
	WebhookSecrets      string
	WebhookAllowPrivate bool
}

// loadSidecarConfig reads and checks every MULLIGAN_* variable through lookup (os.LookupEnv),
// and reports every bad one at once, each error naming its variable. Secret values never
// appear in an error.
func loadSidecarConfig(lookup func(string) (string, bool)) (*sidecarConfig, error) {
	r := &envReader{lookup: lookup}
	c := &sidecarConfig{
		Upstream:            r.upstream("MULLIGAN_UPSTREAM"),
		DataDir:             r.text("MULLIGAN_DATA_DIR"),
		Admin:               r.word("MULLIGAN_ADMIN"),
		GracePeriod:         r.duration("MULLIGAN_GRACE_PERIOD", true),
		Durability:          r.oneOf("MULLIGAN_DURABILITY", "sync", "relaxed"),
		Scope:               r.text("MULLIGAN_SCOPE"),
		Operations:          r.path("MULLIGAN_OPERATIONS"),
		EncryptionKey:       r.encryptionKey("MULLIGAN_ENCRYPTION_KEY", "MULLIGAN_ENCRYPTION_KEY_FILE"),
		IdempotencyRequired: r.boolean("MULLIGAN_IDEMPOTENCY_REQUIRED"),
		IdempotencyTTL:      r.duration("MULLIGAN_IDEMPOTENCY_TTL", true),
		WaitInflight:        r.duration("MULLIGAN_WAIT_INFLIGHT", false),
		AsyncMode:           r.asyncMode("MULLIGAN_ASYNC_MODE"),
		AsyncConcurrency:    r.count("MULLIGAN_ASYNC_CONCURRENCY"),
		AsyncTimeout:        r.duration("MULLIGAN_ASYNC_TIMEOUT", true),
		AsyncQueue:          r.count("MULLIGAN_ASYNC_QUEUE"),
		AsyncTakeover:       r.duration("MULLIGAN_ASYNC_TAKEOVER", true),
		WebhookURL:          r.webhookURL("MULLIGAN_WEBHOOK_URL"),
		WebhookSecrets:      r.webhookSecrets("MULLIGAN_WEBHOOK_SECRET", "MULLIGAN_WEBHOOK_SECRET_FILE"),
		WebhookAllowPrivate: r.boolean("MULLIGAN_WEBHOOK_ALLOW_PRIVATE"),
	}
	c.Bind, c.Port = r.listen("MULLIGAN_LISTEN")
	c.Storage = r.storage("MULLIGAN_STORAGE", &c.DataDir)
	c.StorageDirect = r.storageDirect("MULLIGAN_STORAGE_DIRECT", c.Storage)
	c.Capacity = r.capacity(c.Storage != "")
	c.Batches = r.batches()
	c.Responses = r.responses()
	if c.Upstream == "" && r.ok("MULLIGAN_UPSTREAM") {
		r.fail("MULLIGAN_UPSTREAM", "is required: the model server's address, e.g. 127.0.0.1:8000 or http://model:8000")
	}
	if c.Storage != "" && c.EncryptionKey != "" {
		r.fail("MULLIGAN_ENCRYPTION_KEY", "applies to Badger storage only; with MULLIGAN_STORAGE=postgres://... PostgreSQL encrypts at rest on its own side")
	}
	switch {
	case c.WebhookURL != "" && c.WebhookSecrets == "" && r.ok("MULLIGAN_WEBHOOK_SECRET") && r.ok("MULLIGAN_WEBHOOK_SECRET_FILE"):
		r.fail("MULLIGAN_WEBHOOK_URL", "is set without MULLIGAN_WEBHOOK_SECRET or MULLIGAN_WEBHOOK_SECRET_FILE: events must be signed")
	case c.WebhookURL == "" && c.WebhookSecrets != "" && r.ok("MULLIGAN_WEBHOOK_URL"):
		name := "MULLIGAN_WEBHOOK_SECRET"
		if r.raw(name) == "" {
			name += "_FILE"
		}
		r.fail(name, "is set without MULLIGAN_WEBHOOK_URL")
	}
	if err := errors.Join(r.errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// Caddyfile is the configuration the sidecar runs. It names secrets by placeholder and never
// holds one, so it can be printed, and the JSON it adapts to (which the admin API serves on
// GET /config/) holds none either.
func (c *sidecarConfig) Caddyfile() string {
	var b strings.Builder
	line := func(depth int, words ...string) {
		b.WriteString(strings.Repeat("\t", depth) + strings.Join(words, " ") + "\n")
	}
	line(0, "{")
	line(1, "admin", c.Admin)
	line(1, "persist_config", "off")
	line(1, "auto_https", "off")
	line(1, "grace_period", c.GracePeriod)
	line(0, "}")
	line(0)
	line(0, "http://:"+c.Port, "{")
	if c.Bind != "" {
		line(1, "bind", c.Bind)
	}
	line(1, "mulligan", "{")
	if c.Storage != "" && c.StorageDirect != "" {
		line(2, "storage", "postgres", c.Storage, "{")
		line(3, "direct", c.StorageDirect)
		line(2, "}")
	} else if c.Storage != "" {
		line(2, "storage", "postgres", c.Storage)
	} else {
		line(2, "storage", caddyfileToken(c.DataDir))
	}
	if c.EncryptionKey != "" {
		line(2, "encryption_key", caddyfileToken(c.EncryptionKey))
	}
	line(2, "durability", c.Durability)
	if c.Scope != "" {
		line(2, "scope", caddyfileToken(c.Scope))
	}
	line(2, "operations", c.Operations)
	line(2, "idempotency", "{")
	line(3, "ttl", c.IdempotencyTTL)
	line(3, "wait_inflight", c.WaitInflight)
	if c.IdempotencyRequired {
		line(3, "required")
	}
	line(2, "}")
	line(2, "async", "{")
	line(3, "mode", c.AsyncMode)
	line(3, "concurrency", strconv.Itoa(c.AsyncConcurrency))
	line(3, "timeout", c.AsyncTimeout)
	line(3, "queue", strconv.Itoa(c.AsyncQueue))
	line(3, "takeover", c.AsyncTakeover)
	line(2, "}")
	c.Capacity.caddyfile(line)
	c.Batches.caddyfile(line)
	c.Responses.caddyfile(line)
	if c.WebhookURL != "" {
		line(2, "webhooks", "{")
		line(3, "endpoint", "default", c.WebhookURL, "{")
		line(4, "secret", caddyfileToken(c.WebhookSecrets))
		line(3, "}")
		line(3, "default", "default")
		if c.WebhookAllowPrivate {
			line(3, "allow_private")
		}
		line(2, "}")
	}
	line(1, "}")
	line(1, "reverse_proxy", c.Upstream)
	line(0, "}")
	return b.String()
}

// Adapt turns the Caddyfile into Caddy's JSON config through the caddyfile adapter, exactly
// as `caddy run --adapter caddyfile` would.
func (c *sidecarConfig) Adapt() ([]byte, []caddyconfig.Warning, error) {
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(c.Caddyfile()), map[string]any{"filename": "MULLIGAN_*"})
	if err != nil {
		return nil, nil, fmt.Errorf("the configuration built from the MULLIGAN_* variables does not adapt (`mulligan sidecar --print` shows it): %w", err)
	}
	return out, warnings, nil
}

// sidecarHelp is the variables as a table for `mulligan sidecar --help`.
func sidecarHelp() string {
	var b strings.Builder
	for _, v := range sidecarVars {
		def := v.Default
		if def == "" {
			def = "-"
		}
		fmt.Fprintf(&b, "  %-33s %-18s %s\n", v.Name, def, v.Meaning)
	}
	return b.String()
}

// caddyfileToken writes a checked free-form value as one Caddyfile token, quoted when it holds
// spaces or would otherwise read as a brace, a comment or a heredoc. Values are checked first
// (checkText) to hold no quote, backslash or control character, so quoting needs no escapes.
func caddyfileToken(s string) string {
	// Caddy's lexer ends a token at any Unicode space, not only a space or a tab.
	if strings.IndexFunc(s, unicode.IsSpace) >= 0 || s == "{" || s == "}" || strings.HasPrefix(s, "#") || strings.HasPrefix(s, "<<") {
		return `"` + s + `"`
	}
	return s
}

// envReader reads MULLIGAN_* variables and collects what is wrong with them.
type envReader struct {
	lookup func(string) (string, bool)
	errs   []error
	failed map[string]bool
}

// raw is a variable's value as set, without defaults ("" when unset).
func (r *envReader) raw(name string) string {
	v, _ := r.lookup(name)
	return v
}

// get is a variable's trimmed value, or its default from sidecarVars when unset or empty.
func (r *envReader) get(name string) string {
	if v := strings.TrimSpace(r.raw(name)); v != "" {
		return v
	}
	for _, v := range sidecarVars {
		if v.Name == name {
			return v.Default
		}
	}
	panic("sidecar: " + name + " is not in sidecarVars")
}

func (r *envReader) fail(name, format string, args ...any) {
	if r.failed == nil {
		r.failed = map[string]bool{}
	}
	r.failed[name] = true
	r.errs = append(r.errs, fmt.Errorf("%s %s", name, fmt.Sprintf(format, args...)))
}

// ok tells whether name has no error yet, so one mistake is reported once.
func (r *envReader) ok(name string) bool { return !r.failed[name] }

// text is a free-form value that goes into the Caddyfile as one token.
func (r *envReader) text(name string) string {
	v := r.get(name)
	if err := checkText(v); err != nil {
		r.fail(name, "%v", err)
		return ""
	}
	return v
}

// word is a value without spaces or braces, such as an address.
func (r *envReader) word(name string) string {
	v := r.text(name)
	if strings.ContainsAny(v, " \t{}") {
		r.fail(name, "must not contain spaces or braces, got %q", v)
		return ""
	}
	return v
}

// path is a URL path prefix.
func (r *envReader) path(name string) string {
	v := r.word(name)
	if v != "" && !strings.HasPrefix(v, "/") {
		r.fail(name, "must be a path starting with /, got %q", v)
		return ""
	}
	return v
}

// duration is a Caddy duration (24h, 90s, 1d...); positive, or zero too when !positive.
func (r *envReader) duration(name string, positive bool) string {
	v := r.get(name)
	d, err := caddy.ParseDuration(v)
	switch {
	case err != nil:
		r.fail(name, "must be a duration such as 30s, 10m or 24h, got %q", v)
		return ""
	case d < 0 || (positive && d == 0):
		r.fail(name, "must be a positive duration, got %q", v)
		return ""
	}
	return v
}

// count is a whole number of at least 1.
func (r *envReader) count(name string) int {
	v := r.get(name)
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		r.fail(name, "must be a whole number of at least 1, got %q", v)
		return 0
	}
	return n
}

func (r *envReader) boolean(name string) bool {
	v := r.get(name)
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail(name, "must be true or false, got %q", v)
	}
	return b
}

func (r *envReader) oneOf(name string, choices ...string) string {
	v := r.get(name)
	for _, c := range choices {
		if v == c {
			return v
		}
	}
	r.fail(name, "must be %s, got %q", strings.Join(choices, " or "), v)
	return ""
}

// asyncMode is "prefer", "always" or "after <duration>".
func (r *envReader) asyncMode(name string) string {
	f := strings.Fields(r.get(name))
	switch {
	case len(f) == 1 && (f[0] == "prefer" || f[0] == "always"):
		return f[0]
	case len(f) == 2 && f[0] == "after":
		if d, err := caddy.ParseDuration(f[1]); err == nil && d > 0 {
			return "after " + f[1]
		}
	}
	r.fail(name, "must be prefer, always or after <duration> (e.g. after 2s), got %q", r.get(name))
	return ""
}

// listen splits [host]:port (or a bare port) into the address to bind and the port.
func (r *envReader) listen(name string) (bind, port string) {
	v := r.get(name)
	if _, err := strconv.Atoi(v); err == nil {
		v = ":" + v
	}
	host, port, err := net.SplitHostPort(v)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 1 || n > 65535 {
		r.fail(name, "must be [host]:port with a port from 1 to 65535, e.g. :8080 or 127.0.0.1:8080, got %q", v)
		return "", ""
	}
	if host != "" && net.ParseIP(host) == nil && !isHostname(host) {
		r.fail(name, "has an invalid host %q", host)
		return "", ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host, port
}

// upstream is host:port, scheme://host[:port] (http, https, h2c) or a unix/ socket address,
// all of which reverse_proxy takes.
func (r *envReader) upstream(name string) string {
	v := r.word(name)
	switch {
	case v == "" || strings.HasPrefix(v, "unix/"):
		return v
	case strings.Contains(v, "://"):
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "h2c") || u.Host == "" {
			r.fail(name, "must be host:port or http(s)://host[:port], got %q", v)
			return ""
		}
		if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			r.fail(name, "must be the server's address only, without path, query or credentials")
			return ""
		}
		return u.Scheme + "://" + u.Host
	}
	if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
		r.fail(name, "must be host:port or http(s)://host[:port], got %q", v)
		return ""
	}
	return v
}

// webhookURL is the one absolute http(s) URL events are delivered to.
func (r *envReader) webhookURL(name string) string {
	v := r.word(name)
	if v == "" {
		return ""
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Contains(v, "*") {
		r.fail(name, "must be an absolute http(s) URL without wildcards, got %q", v)
		return ""
	}
	return v
}

// webhookSecrets checks the signing secrets, inline or in a file, whitespace-separated (each
// adds a signature to every delivery, for rotation), each as a Standard Webhooks secret, and
// returns the placeholder the module expands when it starts.
func (r *envReader) webhookSecrets(inline, file string) string {
	text, from, placeholder := r.secret(inline, file)
	if from == "" {
		return ""
	}
	secrets := strings.Fields(text)
	if len(secrets) == 0 {
		r.fail(from, "holds no secret")
		return ""
	}
	for i, s := range secrets {
		if _, err := webhook.ParseSecret(s); err != nil {
			r.fail(from, "secret %d of %d: %v", i+1, len(secrets), err)
			return ""
		}
	}
	return placeholder
}

// encryptionKey checks that the key stands alone where it is and returns the placeholder the
// module resolves when it starts (which also checks its length).
func (r *envReader) encryptionKey(inline, file string) string {
	key, from, placeholder := r.secret(inline, file)
	if from == "" {
		return ""
	}
	if key == "" || key != strings.TrimSpace(key) {
		r.fail(from, "must hold the key alone, without surrounding spaces or blank lines")
		return ""
	}
	return placeholder
}

// storage reads MULLIGAN_STORAGE: a PostgreSQL URL, which the config names by placeholder
// only (it holds a password), or a Badger directory, which stands for MULLIGAN_DATA_DIR. It
// returns the placeholder, or "" for Badger.
func (r *envReader) storage(name string, dataDir *string) string {
	v := strings.TrimSpace(r.raw(name))
	switch {
	case v == "":
		return ""
	case strings.HasPrefix(v, "postgres://") || strings.HasPrefix(v, "postgresql://"):
		if strings.ContainsAny(v, " \t\n\r{}\"\\") {
			r.fail(name, "must be one URL, without spaces, braces, quotes or backslashes (percent-encode them)")
			return ""
		}
		return "{env." + name + "}"
	case strings.HasPrefix(v, "/"):
		if err := checkText(v); err != nil {
			r.fail(name, "%v", err)
			return ""
		}
		if r.raw("MULLIGAN_DATA_DIR") != "" && strings.TrimSpace(r.raw("MULLIGAN_DATA_DIR")) != v {
			r.fail(name, "and MULLIGAN_DATA_DIR name different Badger directories; set one")
			return ""
		}
		*dataDir = v
		return ""
	default:
		r.fail(name, "must be a postgres:// URL or a Badger directory (an absolute path)")
		return ""
	}
}

// storageDirect reads MULLIGAN_STORAGE_DIRECT: a PostgreSQL URL beside a PostgreSQL
// MULLIGAN_STORAGE (whose placeholder is storage), named by placeholder only.
func (r *envReader) storageDirect(name, storage string) string {
	v := strings.TrimSpace(r.raw(name))
	switch {
	case v == "":
		return ""
	case !strings.HasPrefix(v, "postgres://") && !strings.HasPrefix(v, "postgresql://"):
		r.fail(name, "must be a postgres:// URL")
	case strings.ContainsAny(v, " \t\n\r{}\"\\"):
		r.fail(name, "must be one URL, without spaces, braces, quotes or backslashes (percent-encode them)")
	case storage == "":
		r.fail(name, "applies to PostgreSQL storage only: set MULLIGAN_STORAGE=postgres://... (the pooled DSN) beside it")
	default:
		return "{env." + name + "}"
	}
	return ""
}

// secret reads a secret given inline or as a file path: its value as the module will see it,
// the variable it came from ("" when neither is set), and the placeholder that reads it,
// {env.NAME} or {file.PATH}.
func (r *envReader) secret(inline, file string) (value, from, placeholder string) {
	v, path := r.raw(inline), r.get(file)
	switch {
	case v != "" && path != "":
		r.fail(inline, "and %s are both set; set one", file)
		return "", "", ""
	case v != "":
		return v, inline, "{env." + inline + "}"
	case path == "":
		return "", "", ""
	}
	if err := checkText(path); err != nil || strings.ContainsAny(path, "{}") {
		r.fail(file, "must be a plain file path")
		return "", "", ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		r.fail(file, "cannot be read: %v", err)
		return "", "", ""
	}
	// {file.*} drops one trailing line ending, as a file written by an editor has.
	value = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	return value, file, "{file." + path + "}"
}

// checkText refuses what could break out of a Caddyfile token: quotes, backslashes, control
// characters and {$...} environment substitution.
func checkText(s string) error {
	for _, c := range s {
		if c < ' ' || c == 0x7f || c == '"' || c == '`' || c == '\\' {
			return fmt.Errorf("must not contain quotes, backslashes or control characters")
		}
	}
	if strings.Contains(s, "{$") {
		return fmt.Errorf("must not contain {$...}: give the value itself")
	}
	return nil
}

// isHostname reports whether s is made of DNS name characters.
func isHostname(s string) bool {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return s != ""
}

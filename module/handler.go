package module

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/idemkey"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/store"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler puts idempotency in front of the rest of the route (normally reverse_proxy to a model
// server): a request carrying an Idempotency-Key runs upstream once, and its retries replay the
// recorded response.
type Handler struct {
	// StorageBackend is "badger" (default: one process, one directory) or "postgres" (many
	// replicas as one). Every block naming the same storage shares it: its runner, its queue,
	// its outbox and the storage-wide settings (durability, encryption_key, async concurrency
	// and takeover), which blocks must not set differently (docs/caddyfile.md).
	StorageBackend string `json:"storage_backend,omitempty"`

	// Storage is the Badger directory (default: "mulligan" in Caddy's data directory), or with
	// the postgres backend the PostgreSQL DSN; placeholders such as {env.MULLIGAN_POSTGRES_URL}
	// are expanded.
	Storage string `json:"storage,omitempty"`

	// StorageDirect is, with the postgres backend, a DSN that reaches the same database without
	// a connection pooler, when Storage goes through one (PgBouncer in transaction mode): the
	// schema migrations and LISTEN for wake-ups, which need a session, use it. Without it, a
	// replica behind a pooler needs a database migrated already and polls for work
	// (docs/backends.md, "Through PgBouncer"). Placeholders are expanded.
	StorageDirect string `json:"storage_direct,omitempty"`

	// StorageMemory sizes Badger's memory: its memtables, caches and value-log files
	// (docs/backends.md, "Badger's memory"). Storage-wide, like durability: blocks on one
	// storage must not set it differently, and it applies when the storage opens. Badger only.
	StorageMemory *BadgerMemory `json:"storage_memory,omitempty"`

	// EncryptionKey turns on encryption at rest in Badger with a 16, 24 or 32-byte AES key, written in one
	// unambiguous encoding: "hex:<hex digits>", "base64:<standard base64>", or the raw bytes
	// (optionally "raw:<bytes>"). A bare string of 32, 48 or 64 hex digits is refused as ambiguous.
	// Placeholders such as {env.MULLIGAN_KEY} are expanded.
	EncryptionKey string `json:"encryption_key,omitempty"`

	// Scope separates tenants: its value (placeholders expanded per request) is hashed into every
	// record key, and never stored raw. Default: {http.request.header.Authorization}, so callers
	// with different credentials never see each other's responses or operations. A constant (for
	// example "shared") puts every caller in one scope: an explicit choice. A caller whose scope
	// comes out empty (no credentials) lists no operations.
	Scope string `json:"scope,omitempty"`

	// Operations is the path prefix where operation resources are served. Default: /v1/operations.
	Operations string `json:"operations,omitempty"`

	// Durability is "sync" (default): a record is fsynced before the client is answered; or
	// "relaxed": the OS flushes when it likes, and a power loss can drop the last records.
	Durability string `json:"durability,omitempty"`

	// Idempotency configures the Idempotency-Key gate.
	Idempotency *IdempotencyConfig `json:"idempotency,omitempty"`

	// Async configures async conversion and the runner.
	Async *AsyncConfig `json:"async,omitempty"`

	// Webhooks configures signed event delivery about operations.
	Webhooks *WebhooksConfig `json:"webhooks,omitempty"`

	// Capacity bounds the calls sent upstream to the model server's seats and orders the work
	// waiting for one (docs/capacity.md). Without it, calls go upstream as they come.
	Capacity *CapacityConfig `json:"capacity,omitempty"`
	// Batches serves the OpenAI Files and Batches API under a prefix (docs/batches.md); nil:
	// not served.
	Batches *BatchesConfig `json:"batches,omitempty"`
	// Responses serves the Responses API's background mode under a prefix
	// (docs/responses.md); nil: not served, requests pass through.
	Responses *ResponsesConfig `json:"responses,omitempty"`

	storage *storageRef
	gate    *gate
	bodies  *byteBudget
	conv    *converter
	methods map[string]bool
	logger  *zap.Logger
	clock   clockwork.Clock // the one clock of the request path: realClock in production
	seats   *seatPool       // nil without capacity
	seatKey string
	reg     *registry // where the block's seats are kept: its App's
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.mulligan",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision applies defaults and records the block's use of its storage, which opens when the
// config starts; a use that conflicts with another block's on the same storage is refused.
func (h *Handler) Provision(ctx caddy.Context) error {
	appIface, err := ctx.App("mulligan")
	if err != nil {
		return err
	}
	return h.provision(ctx.Logger(), ctx.GetMetricsRegistry(), appIface.(*App))
}

// provision is Provision with what it takes from Caddy's context handed in: the logger, the
// metrics registry and the config's App, which records the block's use of its storage. A
// test builds a handler with it, and an App of its own, without Caddy.
func (h *Handler) provision(log *zap.Logger, reg *prometheus.Registry, app *App) error {
	h.logger = log
	h.clock = realClock
	explicit := h.storageWideSettings()
	h.setDefaults()
	key, err := parseEncryptionKey(caddy.NewReplacer().ReplaceAll(h.EncryptionKey, ""))
	if err != nil {
		return err
	}
	if err := h.Validate(); err != nil {
		return err
	}
	h.gate, err = newGate(h.Idempotency, h.Async, h.clock)
	if err != nil {
		return err
	}
	h.bodies = &byteBudget{limit: h.Idempotency.MaxBuffered}
	h.conv = &converter{cfg: h.Async, prefix: strings.TrimSuffix(h.Operations, "/"), gate: h.gate, clock: h.clock,
		calls: make(slots, h.Async.Concurrency), quota: newAdmission(h.Async.MaxPerScope)}
	if h.Webhooks != nil {
		h.Webhooks.setDefaults()
		if h.conv.webhooks, err = newWebhookSetup(h.Webhooks, caddy.NewReplacer()); err != nil {
			return err
		}
	}
	h.methods = map[string]bool{}
	for _, m := range h.Idempotency.Methods {
		h.methods[m] = true
	}
	if err := registerMetrics(reg); err != nil {
		return err
	}
	zeroSubmitted(h.Async.Type)
	if len(key) > 0 {
		explicit["encryption_key"] = hex.EncodeToString(key)
	}
	set, err := h.spec(key)
	if err != nil {
		return err
	}
	h.reg = app.reg
	h.storage, err = app.use(blockSpec{set: set, explicit: explicit, webhooks: h.conv.webhooks, declared: h.Webhooks})
	if err != nil {
		return fmt.Errorf("mulligan: %w", err)
	}
	return h.provisionCapacity(set)
}

// storageWideSettings are the storage-wide settings the block sets itself, as written; read
// before defaults fill the rest.
func (h *Handler) storageWideSettings() map[string]string {
	out := map[string]string{}
	if h.Durability != "" {
		out["durability"] = h.Durability
	}
	if h.Async != nil && h.Async.Concurrency != 0 {
		out["concurrency"] = strconv.Itoa(h.Async.Concurrency)
	}
	if h.Async != nil && h.Async.Takeover != 0 {
		out["takeover"] = time.Duration(h.Async.Takeover).String()
	}
	if h.StorageDirect != "" {
		out["direct"] = caddy.NewReplacer().ReplaceAll(h.StorageDirect, "")
	}
	for name, v := range h.StorageMemory.explicit() {
		out[name] = v
	}
	return out
}

// spec resolves the block's storage and its storage-wide settings.
func (h *Handler) spec(key []byte) (storageSpec, error) {
	backend, location, err := storageOf(h.StorageBackend, h.Storage)
	if err != nil {
		return storageSpec{}, err
	}
	direct, err := directOf(backend, h.StorageDirect)
	if err != nil {
		return storageSpec{}, err
	}
	if backend == BackendPostgres && len(key) > 0 {
		return storageSpec{}, fmt.Errorf("encryption_key applies to Badger storage only; PostgreSQL encrypts at rest on its own side")
	}
	mem, err := h.StorageMemory.badger(backend)
	if err != nil {
		return storageSpec{}, err
	}
	return storageSpec{backend: backend, location: location, direct: direct, sync: h.Durability == DurabilitySync, key: key,
		concurrency: h.Async.Concurrency, takeover: time.Duration(h.Async.Takeover), memory: mem}, nil
}

func (h *Handler) setDefaults() {
	if h.Operations == "" {
		h.Operations = defaultOperationsPath
	}
	if h.Scope == "" {
		h.Scope = defaultScope
	}
	if h.Durability == "" {
		h.Durability = DurabilitySync
	}
	if h.Async == nil {
		h.Async = new(AsyncConfig)
	}
	h.Async.setDefaults()
	if h.Idempotency == nil {
		h.Idempotency = new(IdempotencyConfig)
	}
	h.Idempotency.setDefaults(h.Async)
	if h.Capacity != nil {
		h.Capacity.setDefaults()
	}
	h.Batches.setDefaults()
	h.Responses.setDefaults(h.Async)
}

// Validate checks the configuration for errors that defaults cannot fix.
func (h *Handler) Validate() error {
	if h.Durability != DurabilitySync && h.Durability != DurabilityRelaxed {
		return fmt.Errorf("durability must be %q or %q, got %q", DurabilitySync, DurabilityRelaxed, h.Durability)
	}
	if err := validOperationsPath(h.Operations); err != nil {
		return err
	}
	if err := h.Async.validate(); err != nil {
		return err
	}
	if h.Capacity != nil {
		if err := h.Capacity.validate(); err != nil {
			return err
		}
	}
	if err := h.Batches.validate(); err != nil {
		return err
	}
	if err := h.Responses.validate(); err != nil {
		return err
	}
	return h.Idempotency.validate()
}

// defaultScope keeps callers with different credentials apart (docs/caddyfile.md).
const defaultScope = "{http.request.header.Authorization}"

// validOperationsPath refuses operations prefixes that would swallow the site: the operations
// API answers everything under its prefix, so "/" would turn every request into an API call.
func validOperationsPath(p string) error {
	trimmed := strings.TrimRight(p, "/")
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("operations must be a path starting with /, got %q", p)
	case trimmed == "":
		return fmt.Errorf("operations %q would serve every request of the site as the operations API; use a prefix of its own such as %s", p, defaultOperationsPath)
	case strings.ContainsAny(p, "*?#{} "):
		return fmt.Errorf("operations must be a plain path prefix (no wildcards, query or placeholders), got %q", p)
	}
	return nil
}

// parseEncryptionKey reads an AES key of 16, 24 or 32 bytes in one unambiguous encoding:
// "hex:...", "base64:..." or raw bytes (optionally "raw:..."). Unprefixed hex digits whose
// decoding has a key's length are refused: 32 of them once meant AES-128 in hex, and as raw
// bytes they would now mean AES-256, so the operator must say which.
func parseEncryptionKey(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	var key []byte
	var err error
	switch {
	case strings.HasPrefix(s, "hex:"):
		key, err = hex.DecodeString(s[len("hex:"):])
	case strings.HasPrefix(s, "base64:"):
		key, err = base64.StdEncoding.DecodeString(s[len("base64:"):])
	case strings.HasPrefix(s, "raw:"):
		key = []byte(s[len("raw:"):])
	default:
		if b, herr := hex.DecodeString(s); herr == nil && validKeyLen(len(b)) {
			return nil, fmt.Errorf("encryption_key: %d hex digits are ambiguous; write hex:<key> for the %d-byte key they encode, or raw:<key> for %d raw bytes", len(s), len(b), len(s))
		}
		key = []byte(s)
	}
	if err != nil {
		return nil, fmt.Errorf("encryption_key: %w", err)
	}
	if !validKeyLen(len(key)) {
		return nil, fmt.Errorf("encryption_key must be 16, 24 or 32 bytes (raw, hex:<hex> or base64:<base64>), got %d bytes", len(key))
	}
	return key, nil
}

func validKeyLen(n int) bool { return n == 16 || n == 24 || n == 32 }

// now reads the handler's clock.
func (h *Handler) now() time.Time { return h.clock.Now() }

// ServeHTTP serves the operations API, and sends covered requests through the idempotency
// gate and async conversion. Requests the runner replays through the server pass straight on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if runner.Executing(r.Context()) {
		return next.ServeHTTP(w, r)
	}
	now := h.now()
	id := requestID(r, now)
	w.Header().Set(headerRequestID, id)
	r.Header.Set(headerRequestID, id)
	if isHealthPath(r.URL.Path) {
		h.serveHealth(w, r)
		return nil
	}
	if h.Batches.covers(r.URL.Path) {
		h.serveBatchesAPI(w, r)
		return nil
	}
	if h.Responses.covers(r.URL.Path) && h.serveResponses(w, r) {
		return nil
	}
	isOps := h.isOperationsPath(r.URL.Path)
	if !isOps && !h.methods[r.Method] {
		return next.ServeHTTP(w, r)
	}
	s, done, err := h.storage.acquire()
	if err != nil {
		h.storageFailed(w, err)
		return nil
	}
	defer done()
	log := newReqLog(h.logger, zap.String("request_id", id))
	if isOps {
		h.serveOperations(w, r, s.be, s.run, h.callerOf(r), log)
		return nil
	}
	w.Header().Add("Vary", "Prefer")
	return h.serveCovered(w, r, next, s.be, s.run, log)
}

// serveCovered runs a covered request: directly, through the gate, or as an operation.
func (h *Handler) serveCovered(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, st store.Backend, run *runner.Runner, log reqLog) error {
	key, ok := h.gate.keyOf(w, r)
	if !ok {
		return nil
	}
	convert, window := conversion(h.Async, r.Header.Values("Prefer"))
	if h.seats != nil {
		// The hashed scope, as keyed calls and operations use: the raw one is a credential.
		next = h.seated(next, idemkey.Scope(h.scopeOf(r)))
	}
	if key == "" && !convert {
		countRequest(outcomePassthrough)
		return next.ServeHTTP(w, r)
	}
	kr, err := h.gate.prepare(w, r, h.bodies, key, h.scopeOf(r), log)
	if errors.Is(err, errAnswered) {
		return nil
	}
	if err != nil {
		return err
	}
	defer h.bodies.give(kr.reserved)
	if convert && !h.conv.describe(w, kr) {
		return nil
	}
	switch {
	case !convert:
		return h.gate.claimAndRun(w, kr, next, st)
	case window == 0:
		return h.conv.accept(w, kr, st, run)
	case h.seats == nil:
		return h.conv.runThenConvert(w, kr, next, st, run, window)
	}
	seat, ok := h.reserveSeat(kr, window)
	switch {
	case !ok && r.Context().Err() != nil:
		return nil // the client left while it waited: nobody wants the operation
	case !ok: // no seat within the window: the call waits in the queue instead (docs/capacity.md)
		return h.conv.accept(w, kr, st, run)
	}
	defer seat.Drop()
	return h.conv.runThenConvert(w, kr, next, st, run, window)
}

func (h *Handler) isOperationsPath(p string) bool {
	prefix := h.conv.prefix
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

// scopeOf expands the scope placeholders for r.
func (h *Handler) scopeOf(r *http.Request) string {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		return ""
	}
	return repl.ReplaceAll(h.Scope, "")
}

// caller is who a call of the gateway's own APIs (operations, files, batches) comes from: the
// hash of its scope, and whether that scope came out empty. A caller without credentials has
// no scope to share with others like it (docs/caddyfile.md, scope): it lists nothing, and
// reaches only the ids it was given.
type caller struct {
	scope     string // the hash of the caller's scope
	anonymous bool
}

// callerOf is r's caller.
func (h *Handler) callerOf(r *http.Request) caller {
	s := h.scopeOf(r)
	return caller{scope: idemkey.Scope(s), anonymous: s == ""}
}

func (h *Handler) storageFailed(w http.ResponseWriter, err error) {
	countRequest(outcomeStorage)
	h.logger.Error("storage unavailable", zap.String("request_id", w.Header().Get(headerRequestID)), zap.Error(err))
	apierr.Write(w, apierr.Error{Code: apierr.CodeStorage, Message: "The gateway's storage is unavailable; retry shortly.", RetryAfter: time.Second})
}

// storeLogger gives the storage backends' log lines to Caddy's logger.
type storeLogger struct{ *zap.SugaredLogger }

func (l storeLogger) Warningf(f string, v ...any) { l.Warnf(f, v...) }

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

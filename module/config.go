package module

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mulligan-gw/mulligan/internal/fingerprint"
	"github.com/mulligan-gw/mulligan/internal/runner"

	"github.com/caddyserver/caddy/v2"
)

// Defaults, applied in Provision to every option left unset.
const (
	defaultHeader         = "Idempotency-Key"
	defaultTTL            = 24 * time.Hour
	defaultMaxBody        = 16 << 20
	defaultMaxBuffered    = 256 << 20
	defaultMismatchStatus = 409
	defaultAsyncTimeout   = 10 * time.Minute
	defaultMaxResult      = 32 << 20
	defaultOperationsPath = "/v1/operations"
)

// Durability modes.
const (
	// DurabilitySync fsyncs every record before the client is answered (group commit).
	DurabilitySync = "sync"
	// DurabilityRelaxed leaves fsync to the operating system: faster, but a power loss may drop
	// the last records.
	DurabilityRelaxed = "relaxed"
)

// IdempotencyConfig configures the Idempotency-Key gate.
type IdempotencyConfig struct {
	// Methods the gate covers. Default: POST, PATCH.
	Methods []string `json:"methods,omitempty"`

	// Header carrying the idempotency key. Default: Idempotency-Key.
	Header string `json:"header,omitempty"`

	// Required answers 400 IDEMPOTENCY_KEY_REQUIRED to a covered request without a key.
	// Default: the key is optional and keyless requests pass through.
	Required bool `json:"required,omitempty"`

	// TTL is how long a completed key replays its response. Default: 24h.
	TTL caddy.Duration `json:"ttl,omitempty"`

	// Lease is how long an in-flight claim holds after the gateway crashed, and the longest a
	// keyed upstream call may run. Default: the async timeout (10m).
	Lease caddy.Duration `json:"lease,omitempty"`

	// MaxBody is the largest request body accepted, in bytes; larger ones get
	// 413 REQUEST_TOO_LARGE. Default: 16 MiB.
	MaxBody int64 `json:"max_body,omitempty"`

	// MaxBuffered bounds the bytes of request bodies this handler holds in memory at once
	// (bodies are read whole to fingerprint and store them); a request that would pass it gets
	// 503 GATEWAY_BUSY with Retry-After instead of the process running out of memory. It is at
	// least max_body. Default: 256 MiB.
	MaxBuffered int64 `json:"max_buffered,omitempty"`

	// FingerprintIgnore lists JSON pointers (RFC 6901) left out of a JSON body's fingerprint,
	// such as a per-attempt request id.
	FingerprintIgnore []string `json:"fingerprint_ignore,omitempty"`

	// MismatchStatus answers a key reused with a different payload: 409 (default) or 422
	// (the IETF draft's choice).
	MismatchStatus int `json:"mismatch_status,omitempty"`

	// WaitInflight, when above zero, makes a duplicate of an in-flight request wait up to this
	// long for the first one's response instead of answering 409 at once.
	WaitInflight caddy.Duration `json:"wait_inflight,omitempty"`

	// StoreStatus lists which upstream statuses are recorded for replay: classes ("2xx", "4xx")
	// or exact codes ("503"). A class never covers 408, 425 or 429, which mean "try again";
	// list them as codes to record them. Default: 2xx 4xx.
	StoreStatus []string `json:"store_status,omitempty"`
}

// AsyncConfig configures async conversion: which calls become 202 Accepted plus an operation,
// and how the runner executes them.
type AsyncConfig struct {
	// Mode says which requests are converted: "prefer" (default) converts requests that send
	// Prefer: respond-async (RFC 7240); "always" converts every covered request; "after" runs the
	// request and answers it directly if the upstream finishes within After, else converts it.
	// Prefer: wait=N sets that window per request.
	Mode string `json:"mode,omitempty"`

	// After is the window of mode "after". Default: 2s.
	After caddy.Duration `json:"after,omitempty"`

	// Concurrency is how many queued operations run upstream at once. Default: 4.
	Concurrency int `json:"concurrency,omitempty"`

	// Queue is how many operations may wait; past it new ones get 503 QUEUE_FULL. Default: 10000.
	Queue int `json:"queue,omitempty"`

	// Timeout bounds one upstream execution. Default: 10m.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Retries is how many times an operation's upstream call is retried on a status of RetryOn
	// or a connection error, with exponential backoff and full jitter. Default: 3.
	Retries *int `json:"retries,omitempty"`

	// Retention is how long a final operation and its result are kept; then it reads as expired
	// for 7 more days, then 404. Default: 24h.
	Retention caddy.Duration `json:"retention,omitempty"`

	// MaxResult is the largest upstream response recorded, in bytes. An operation whose response
	// is larger fails with RESULT_TOO_LARGE; a larger keyed synchronous response still reaches the
	// client but is not replayable and its key is released. Default: 32 MiB.
	MaxResult int64 `json:"max_result,omitempty"`

	// Takeover is how long a worker holding a running operation may stay silent (a crashed
	// process, a replica cut off from storage) before the operation is taken over: re-queued,
	// or failed per OnCrash. One value per storage. Default: 30s.
	Takeover caddy.Duration `json:"takeover,omitempty"`

	// Type names the kind of the operations this block accepts (for example chat_completion):
	// shown as the operation's type and in its events. Default: the request's path.
	Type string `json:"type,omitempty"`

	// RetryOn lists the upstream statuses an operation's call is retried on (connection errors
	// always are), up to Retries times. Default: 408 429 502 503 504.
	RetryOn []int `json:"retry_on,omitempty"`

	// MaxPerScope, when above zero, bounds a scope's queued plus running operations: past it a
	// new one gets 429 RATE_LIMITED with Retry-After, so one caller cannot fill the queue.
	// Default: 0 (no bound).
	MaxPerScope int `json:"max_per_scope,omitempty"`

	// OnCrash says what happens to operations that were running when the gateway died:
	// "requeue" (default) runs them again; "fail" fails them with WORKER_LOST, for upstreams that
	// are not safe to rerun.
	OnCrash string `json:"on_crash,omitempty"`
}

// Async modes and crash policies.
const (
	ModePrefer   = "prefer"
	ModeAlways   = "always"
	ModeAfter    = "after"
	CrashRequeue = "requeue"
	CrashFail    = "fail"
)

func (c *IdempotencyConfig) setDefaults(async *AsyncConfig) {
	if len(c.Methods) == 0 {
		c.Methods = []string{"POST", "PATCH"}
	}
	for i, m := range c.Methods {
		c.Methods[i] = strings.ToUpper(m)
	}
	if c.Header == "" {
		c.Header = defaultHeader
	}
	if c.TTL == 0 {
		c.TTL = caddy.Duration(defaultTTL)
	}
	if c.Lease == 0 {
		c.Lease = async.Timeout
	}
	if c.MaxBody == 0 {
		c.MaxBody = defaultMaxBody
	}
	if c.MaxBuffered == 0 {
		c.MaxBuffered = max(defaultMaxBuffered, c.MaxBody)
	}
	if c.MismatchStatus == 0 {
		c.MismatchStatus = defaultMismatchStatus
	}
	if len(c.StoreStatus) == 0 {
		c.StoreStatus = []string{"2xx", "4xx"}
	}
}

func (c *AsyncConfig) setDefaults() {
	if c.Mode == "" {
		c.Mode = ModePrefer
	}
	if c.After == 0 {
		c.After = caddy.Duration(2 * time.Second)
	}
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.Queue == 0 {
		c.Queue = 10000
	}
	if c.Timeout == 0 {
		c.Timeout = caddy.Duration(defaultAsyncTimeout)
	}
	if c.Retries == nil {
		three := 3
		c.Retries = &three
	}
	if c.Retention == 0 {
		c.Retention = caddy.Duration(24 * time.Hour)
	}
	if c.MaxResult == 0 {
		c.MaxResult = defaultMaxResult
	}
	if c.OnCrash == "" {
		c.OnCrash = CrashRequeue
	}
	if c.Takeover == 0 {
		c.Takeover = caddy.Duration(defaultTakeover)
	}
	if len(c.RetryOn) == 0 {
		c.RetryOn = slices.Clone(defaultRetryOn)
	}
}

// defaultRetryOn are the statuses that say "try again" (runner.DefaultRetryOn).
var defaultRetryOn = runner.DefaultRetryOn

func (c *AsyncConfig) validate() error {
	switch {
	case c.Mode != ModePrefer && c.Mode != ModeAlways && c.Mode != ModeAfter:
		return fmt.Errorf("async: mode must be prefer, always or after, got %q", c.Mode)
	case c.OnCrash != CrashRequeue && c.OnCrash != CrashFail:
		return fmt.Errorf("async: on_crash must be requeue or fail, got %q", c.OnCrash)
	case c.Takeover < caddy.Duration(time.Second):
		return fmt.Errorf("async: takeover must be at least 1s, got %s", time.Duration(c.Takeover))
	case slices.ContainsFunc(c.RetryOn, func(code int) bool { return code < 400 || code > 599 }):
		return fmt.Errorf("async: retry_on takes statuses from 400 to 599, got %v", c.RetryOn)
	case c.Concurrency < 1 || c.Queue < 1 || *c.Retries < 0 || c.Timeout <= 0 || c.After <= 0 || c.Retention <= 0 || c.MaxPerScope < 0:
		return fmt.Errorf("async: concurrency and queue must be at least 1; retries and max_per_scope not negative; timeout, after and retention positive")
	}
	return nil
}

func (c *IdempotencyConfig) validate() error {
	if c.MismatchStatus != 409 && c.MismatchStatus != 422 {
		return fmt.Errorf("idempotency: mismatch_status must be 409 or 422, got %d", c.MismatchStatus)
	}
	if c.TTL < 0 || c.Lease < 0 || c.WaitInflight < 0 || c.MaxBody < 0 {
		return fmt.Errorf("idempotency: ttl, lease, wait_inflight and max_body must not be negative")
	}
	if c.MaxBuffered < c.MaxBody {
		return fmt.Errorf("idempotency: max_buffered (%d bytes) must be at least max_body (%d bytes)", c.MaxBuffered, c.MaxBody)
	}
	if _, err := parseStatusPolicy(c.StoreStatus); err != nil {
		return err
	}
	for _, p := range c.FingerprintIgnore {
		if _, err := fingerprint.ParsePointer(p); err != nil {
			return fmt.Errorf("idempotency: fingerprint_ignore: %w", err)
		}
	}
	return nil
}

// statusPolicy decides which upstream statuses are recorded for replay.
type statusPolicy struct {
	classes [6]bool
	codes   map[int]bool
}

// retryLater are statuses that ask the client to come back: never recorded by a class.
var retryLater = map[int]bool{408: true, 425: true, 429: true}

func parseStatusPolicy(specs []string) (statusPolicy, error) {
	p := statusPolicy{codes: map[int]bool{}}
	for _, s := range specs {
		s = strings.ToLower(strings.TrimSpace(s))
		if len(s) == 3 && strings.HasSuffix(s, "xx") && s[0] >= '1' && s[0] <= '5' {
			p.classes[s[0]-'0'] = true
			continue
		}
		code, err := strconv.Atoi(s)
		if err != nil || code < 100 || code > 599 {
			return p, fmt.Errorf("idempotency: store_status: %q is neither a class like 2xx nor a status code", s)
		}
		p.codes[code] = true
	}
	return p, nil
}

func (p statusPolicy) records(status int) bool {
	if p.codes[status] {
		return true
	}
	return status >= 100 && status <= 599 && p.classes[status/100] && !retryLater[status]
}

package module

import (
	"bytes"
	"fmt"
	"time"

	"encoding/json"
	"flag"
	"github.com/caddyserver/caddy/v2"
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestShippedCaddyfileAdapts checks that the repository's Caddyfile adapts to the JSON in
// testdata/Caddyfile.json (run with -update after an intended change).
func TestShippedCaddyfileAdapts(t *testing.T) {
	os.Unsetenv("MULLIGAN_UPSTREAM")
	src, err := os.ReadFile("../Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) > 0 {
		t.Fatalf("warnings: %v", warnings)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	pretty.WriteByte('\n')
	if *update {
		if err := os.WriteFile("testdata/Caddyfile.json", pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/Caddyfile.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pretty.Bytes(), want) {
		t.Fatalf("the Caddyfile adapts to\n%s\nwant\n%s", pretty.Bytes(), want)
	}
}

func TestCaddyfileParsesEveryOption(t *testing.T) {
	d := caddyfile.NewTestDispenser(`mulligan {
		storage /var/lib/mulligan
		encryption_key 0123456789abcdef
		scope {http.request.header.Authorization}
		operations /v1/ops
		durability relaxed
		idempotency {
			methods post PUT
			header X-Key
			required
			ttl 1h
			lease 2m
			max_body 1MiB
			max_buffered 64MiB
			fingerprint_ignore /a /b/c
			mismatch_status 422
			wait_inflight 3s
			store_status 2xx 404
		}
		async {
			mode after 3s
			concurrency 2
			queue 50
			timeout 5m
			retries 0
			retention 1h
			max_result 2MiB
			on_crash fail
			max_per_scope 5
		}
		capacity {
			limit auto 2 32
			shared 8
			wait 5s
			max_queue_wait 10m
			pass_priority sglang
		}
		webhooks {
			endpoint consumer_a https://consumer.example.com/webhooks/* {
				secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD
			}
			endpoint b https://b.example.com/hook {
				secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
				signature x-webhook
			}
			default b
			events operation.succeeded operation.running
			timeout 5s
			max_attempts 3
			max_age 1h
			breaker 7 10s
			backoff 2s 1m
			allow_private
		}
	}`)
	var h Handler
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	i := h.Idempotency
	if h.Storage != "/var/lib/mulligan" || h.Durability != "relaxed" || h.Operations != "/v1/ops" ||
		!i.Required || i.Header != "X-Key" || i.MaxBody != 1<<20 || i.MismatchStatus != 422 ||
		len(i.FingerprintIgnore) != 2 || len(i.StoreStatus) != 2 || h.Async.MaxResult != 2<<20 || i.MaxBuffered != 64<<20 || h.Async.MaxPerScope != 5 {
		t.Fatalf("parsed %+v %+v %+v", h, *i, *h.Async)
	}
	if c := h.Capacity; c == nil || !c.Auto || c.Min != 2 || c.Max != 32 || c.Shared != 8 || c.Wait != caddy.Duration(5*time.Second) || c.MaxQueueWait != caddy.Duration(10*time.Minute) || c.PassPriority != "sglang" {
		t.Fatalf("capacity %+v", h.Capacity)
	}
	a, wh := h.Async, h.Webhooks
	if a.Mode != ModeAfter || a.After != caddy.Duration(3*time.Second) || a.Concurrency != 2 || a.Queue != 50 || *a.Retries != 0 || a.OnCrash != CrashFail {
		t.Fatalf("async %+v", *a)
	}
	if len(wh.Endpoints) != 2 || len(wh.Endpoints[0].Secrets) != 2 || wh.Default != "b" || wh.BreakerFailures != 7 ||
		wh.Endpoints[0].Signature != "" || wh.Endpoints[1].Signature != "x-webhook" ||
		wh.BackoffMax != caddy.Duration(time.Minute) || !wh.AllowPrivate || wh.MaxAttempts != 3 || len(wh.Events) != 2 {
		t.Fatalf("webhooks %+v", *wh)
	}
	wh.setDefaults()
	if _, err := newWebhookSetup(wh, caddy.NewReplacer()); err != nil {
		t.Fatalf("provisioning the webhooks: %v", err)
	}
}

func TestCaddyfileStoragePostgresTakesADirectDSN(t *testing.T) {
	var h Handler
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`mulligan {
		storage postgres {env.MULLIGAN_POSTGRES_URL} {
			direct {env.MULLIGAN_STORAGE_DIRECT}
		}
		durability relaxed
	}`))
	if err != nil || h.StorageBackend != BackendPostgres || h.Storage != "{env.MULLIGAN_POSTGRES_URL}" ||
		h.StorageDirect != "{env.MULLIGAN_STORAGE_DIRECT}" || h.Durability != DurabilityRelaxed {
		t.Fatalf("%v: %q %q direct %q, durability %q", err, h.StorageBackend, h.Storage, h.StorageDirect, h.Durability)
	}
}

// TestCaddyfileStorageBadgerTakesItsMemorySettings: the block under storage badger sizes
// Badger's memory (docs/backends.md, "Badger's memory"), each setting storage-wide.
func TestCaddyfileStorageBadgerTakesItsMemorySettings(t *testing.T) {
	var h Handler
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`mulligan {
		storage badger /var/lib/mulligan {
			memtable_size       8MiB
			memtables           2
			block_cache         16MiB
			index_cache         4MiB
			value_log_file_size 32MiB
		}
	}`))
	want := BadgerMemory{MemTableSize: 8 << 20, MemTables: 2, BlockCache: 16 << 20, IndexCache: 4 << 20, ValueLogFileSize: 32 << 20}
	if err != nil || h.StorageMemory == nil || *h.StorageMemory != want {
		t.Fatalf("%v: %+v, want %+v", err, h.StorageMemory, want)
	}
	if got := h.storageWideSettings(); got["memtables"] != "2" || got["value_log_file_size"] != "33554432" {
		t.Fatalf("storage-wide settings %v, want the memory settings among them", got)
	}
	for _, tc := range []struct {
		mem     BadgerMemory
		backend string
		want    string
	}{
		{BadgerMemory{MemTables: 17}, BackendBadger, "memtables must be from 1 to 16, got 17"},
		{BadgerMemory{ValueLogFileSize: 4 << 30}, BackendBadger, "value_log_file_size must be from 1MiB to 2047MiB"},
		{BadgerMemory{BlockCache: 512}, BackendBadger, "block_cache must be from 1MiB"},
		{BadgerMemory{MemTableSize: 8 << 20}, BackendPostgres, "apply to storage badger only"},
	} {
		if _, err := tc.mem.badger(tc.backend); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v on %s: %v, want %q", tc.mem, tc.backend, err, tc.want)
		}
	}
}

// TestCaddyfileRejectsMistakes checks each mistake's message, so a case cannot pass because the
// parser tripped over something else.
func TestCaddyfileRejectsMistakes(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"mulligan extra", "unexpected line ending after 'extra', at Testfile:1"},
		{"mulligan {\n bogus\n}", `unrecognized mulligan subdirective "bogus"`},
		{"mulligan {\n durability maybe\n}", `durability must be sync or relaxed, got "maybe"`},
		{"mulligan {\n idempotency {\n mismatch_status 418\n }\n}", `mismatch_status must be 409 or 422, got "418"`},
		{"mulligan {\n idempotency {\n ttl forever\n }\n}", `invalid duration "forever" for ttl`},
		{"mulligan {\n idempotency {\n max_body -5\n }\n}", `invalid size "-5"`},
		{"mulligan {\n idempotency {\n store_status 2yy\n }\n}", `"2yy" is neither a class like 2xx nor a status code`},
		{"mulligan {\n idempotency {\n required yes\n }\n}", "unexpected line ending after 'yes'"},
		{"mulligan {\n storage\n}", "storage takes a Badger directory, or badger <dir>, or postgres <dsn>"},
		{"mulligan {\n storage /var/lib/m {\n direct postgres://db/m\n }\n}", "direct applies to storage postgres <dsn> only"},
		{"mulligan {\n storage postgres postgres://pgbouncer/m {\n direct\n }\n}", "wrong argument count"},
		{"mulligan {\n storage postgres postgres://pgbouncer/m {\n session postgres://db/m\n }\n}", `unrecognized storage option "session" (storage postgres takes direct <dsn>)`},
		{"mulligan {\n storage postgres postgres://pgbouncer/m {\n memtables 2\n }\n}", `unrecognized storage option "memtables" (storage postgres takes direct <dsn>)`},
		{"mulligan {\n storage /var/lib/m {\n memtables 0\n }\n}", `memtables must be a whole number of at least 1, got "0"`},
		{"mulligan {\n storage /var/lib/m {\n block_cache lots\n }\n}", `invalid size "lots"`},
		{"mulligan {\n storage badger /var/lib/m {\n cache 1GiB\n }\n}", `unrecognized storage option "cache" (storage badger takes memtable_size, memtables, block_cache, index_cache, value_log_file_size)`},
		{"mulligan {\n async {\n mode sometimes\n }\n}", `mode must be prefer, always or after <duration>, got "sometimes"`},
		{"mulligan {\n async {\n concurrency 0\n }\n}", `concurrency must be a whole number of at least 1, got "0"`},
		{"mulligan {\n webhooks {\n endpoint a https://x.example.com\n }\n}", `endpoint "a" needs a secret`},
		{"mulligan {\n webhooks {\n breaker 5\n }\n}", "unexpected line ending after '5'"},
		{"mulligan {\n webhooks {\n endpoint a https://x.example.com {\n secret s\n signature hmac\n }\n }\n}", `endpoint "a": signature must be standard-webhooks or x-webhook, got "hmac"`},
		{"mulligan {\n webhooks {\n endpoint a https://x.example.com {\n secret s\n signature\n }\n }\n}", "unexpected line ending after 'signature'"},
		{"mulligan {\n async {\n max_per_scope -1\n }\n}", `max_per_scope must be a whole number of at least 0, got "-1"`},
		{"mulligan {\n idempotency {\n max_buffered lots\n }\n}", `invalid size "lots"`},
		{"mulligan {\n capacity {\n limit 0\n }\n}", `limit must be a whole number of at least 1, or auto <min> <max>, got "0"`},
		{"mulligan {\n capacity {\n limit auto 8 4\n }\n}", `limit auto takes a minimum and a maximum, 1 <= min <= max, got "8" "4"`},
		{"mulligan {\n capacity {\n limit auto\n }\n}", `limit must be a whole number of at least 1, or auto <min> <max>, got "auto"`},
		{"mulligan {\n capacity {\n limit auto 1\n }\n}", "limit takes a number, or auto <min> <max>"},
		{"mulligan {\n capacity {\n shared 0\n }\n}", `shared must be a whole number of at least 1, got "0"`},
		{"mulligan {\n capacity {\n wait soon\n }\n}", `invalid duration "soon" for wait`},
		{"mulligan {\n capacity {\n seats 4\n }\n}", `unrecognized capacity subdirective "seats"`},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.src, err, tc.want)
		}
	}
}

func FuzzCaddyfile(f *testing.F) {
	for _, s := range []string{
		"mulligan",
		"mulligan {\n storage /x\n idempotency {\n ttl 1h\n max_body 1KiB\n }\n}",
		"mulligan {\n idempotency {\n store_status 2xx 503\n fingerprint_ignore /a~1b\n }\n}",
		"mulligan {\n async {\n max_result 99999999999999999999\n }\n}",
		"mulligan {\n{\n}}}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		// A parser that stalls on some input is a bug too: crash with the input to keep it.
		watchdog := time.AfterFunc(3*time.Second, func() { panic(fmt.Sprintf("parsing took over 3s: %q", src)) })
		defer watchdog.Stop()
		tokens, err := caddyfile.Tokenize([]byte(src), "fuzz")
		if err != nil {
			return
		}
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens)); err != nil {
			return
		}
		if h.Idempotency != nil && h.Idempotency.MaxBody > 1<<40 {
			t.Fatalf("accepted max_body %d", h.Idempotency.MaxBody)
		}
	})
}

package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// Two valid Standard Webhooks secrets: the current one and the one being rotated out.
var secretNew, secretOld = testkit.SecretNew, testkit.SecretOld

// environ is a lookup over the given NAME, value pairs only.
func environ(pairs ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(pairs); i += 2 {
		m[pairs[i]] = pairs[i+1]
	}
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func mustLoad(t *testing.T, pairs ...string) *sidecarConfig {
	t.Helper()
	c, err := loadSidecarConfig(environ(pairs...))
	if err != nil {
		t.Fatalf("%v: %v", pairs, err)
	}
	return c
}

// mustAdapt adapts the generated Caddyfile and returns the JSON; warnings fail the test.
func mustAdapt(t *testing.T, c *sidecarConfig) string {
	t.Helper()
	out, warnings, err := c.Adapt()
	if err != nil {
		t.Fatalf("%v\n%s", err, c.Caddyfile())
	}
	if len(warnings) > 0 {
		t.Fatalf("adapter warnings: %v\n%s", warnings, c.Caddyfile())
	}
	return string(out)
}

func TestDefaultsGiveTheDocumentedCaddyfile(t *testing.T) {
	c := mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000")
	want := `{
	admin localhost:2019
	persist_config off
	auto_https off
	grace_period 30s
}

http://:8080 {
	mulligan {
		storage /var/lib/mulligan
		durability sync
		operations /v1/operations
		idempotency {
			ttl 24h
			wait_inflight 0s
		}
		async {
			mode prefer
			concurrency 4
			timeout 10m
			queue 10000
			takeover 30s
		}
	}
	reverse_proxy 127.0.0.1:8000
}
`
	if got := c.Caddyfile(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	js := mustAdapt(t, c)
	for _, part := range []string{`"listen":[":8080"]`, `"grace_period":30000000000`, `"persist":false`, `"dial":"127.0.0.1:8000"`, `"storage":"/var/lib/mulligan"`} {
		if !strings.Contains(js, part) {
			t.Errorf("the JSON lacks %s:\n%s", part, js)
		}
	}
}

func TestEachVariableReachesTheCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		lines       []string // each must appear, trimmed, as a whole line
		json        string   // and this in the adapted JSON, when set
	}{
		{"MULLIGAN_UPSTREAM", "http://model:8000", []string{"reverse_proxy http://model:8000"}, `"dial":"model:8000"`},
		{"MULLIGAN_UPSTREAM", "https://model.internal", []string{"reverse_proxy https://model.internal"}, `"dial":"model.internal:443"`},
		{"MULLIGAN_LISTEN", "127.0.0.1:9000", []string{"http://:9000 {", "bind 127.0.0.1"}, `"listen":["127.0.0.1:9000"]`},
		{"MULLIGAN_LISTEN", "0.0.0.0:8081", []string{"http://:8081 {", "bind 0.0.0.0"}, `"listen":["0.0.0.0:8081"]`},
		{"MULLIGAN_LISTEN", "[::1]:9000", []string{"bind [::1]"}, `"listen":["[::1]:9000"]`},
		{"MULLIGAN_LISTEN", "9001", []string{"http://:9001 {"}, `"listen":[":9001"]`},
		{"MULLIGAN_DATA_DIR", "/data/mulligan", []string{"storage /data/mulligan"}, `"storage":"/data/mulligan"`},
		{"MULLIGAN_DATA_DIR", "/mnt/my volume", []string{`storage "/mnt/my volume"`}, `"storage":"/mnt/my volume"`},
		{"MULLIGAN_ADMIN", "off", []string{"admin off"}, `"disabled":true`},
		{"MULLIGAN_ADMIN", "127.0.0.1:2020", []string{"admin 127.0.0.1:2020"}, `"listen":"127.0.0.1:2020"`},
		{"MULLIGAN_GRACE_PERIOD", "45s", []string{"grace_period 45s"}, `"grace_period":45000000000`},
		{"MULLIGAN_DURABILITY", "relaxed", []string{"durability relaxed"}, `"durability":"relaxed"`},
		{"MULLIGAN_SCOPE", "{http.request.header.Authorization}", []string{"scope {http.request.header.Authorization}"}, `"scope":"{http.request.header.Authorization}"`},
		{"MULLIGAN_SCOPE", "{http.request.header.X-Org} {http.request.header.X-User}", []string{`scope "{http.request.header.X-Org} {http.request.header.X-User}"`}, `"scope":"{http.request.header.X-Org} {http.request.header.X-User}"`},
		{"MULLIGAN_OPERATIONS", "/jobs", []string{"operations /jobs"}, `"operations":"/jobs"`},
		{"MULLIGAN_IDEMPOTENCY_REQUIRED", "true", []string{"required"}, `"required":true`},
		{"MULLIGAN_IDEMPOTENCY_TTL", "48h", []string{"ttl 48h"}, `"ttl":172800000000000`},
		{"MULLIGAN_IDEMPOTENCY_TTL", "2d", []string{"ttl 2d"}, `"ttl":172800000000000`},
		{"MULLIGAN_WAIT_INFLIGHT", "30s", []string{"wait_inflight 30s"}, `"wait_inflight":30000000000`},
		{"MULLIGAN_ASYNC_MODE", "always", []string{"mode always"}, `"mode":"always"`},
		{"MULLIGAN_ASYNC_MODE", "after 2s", []string{"mode after 2s"}, `"after":2000000000`},
		{"MULLIGAN_ASYNC_MODE", "  after   500ms ", []string{"mode after 500ms"}, `"after":500000000`},
		{"MULLIGAN_ASYNC_CONCURRENCY", "16", []string{"concurrency 16"}, `"concurrency":16`},
		{"MULLIGAN_ASYNC_TIMEOUT", "1h", []string{"timeout 1h"}, `"timeout":3600000000000`},
		{"MULLIGAN_ASYNC_QUEUE", "50", []string{"queue 50"}, `"queue":50`},
		{"MULLIGAN_ENCRYPTION_KEY", "0123456789abcdef", []string{"encryption_key {env.MULLIGAN_ENCRYPTION_KEY}"}, `"encryption_key":"{env.MULLIGAN_ENCRYPTION_KEY}"`},
		{"MULLIGAN_STORAGE", "postgres://mulligan:secret@db:5432/mulligan", []string{"storage postgres {env.MULLIGAN_STORAGE}"}, `"storage":"{env.MULLIGAN_STORAGE}","storage_backend":"postgres"`},
		{"MULLIGAN_STORAGE", "/data/shared", []string{"storage /data/shared"}, `"storage":"/data/shared"`},
		{"MULLIGAN_ASYNC_TAKEOVER", "45s", []string{"takeover 45s"}, `"takeover":45000000000`},
		{"MULLIGAN_CAPACITY_LIMIT", "8", []string{"capacity {", "limit 8", "wait 30s"}, `"capacity":{"limit":8,"wait":30000000000}`},
		{"MULLIGAN_CAPACITY_LIMIT", " auto  2 16 ", []string{"limit auto 2 16"}, `"capacity":{"auto":true,"max":16,"min":2,"wait":30000000000}`},
		{"MULLIGAN_CAPACITY_WAIT", "5s", []string{"capacity {", "wait 5s"}, `"capacity":{"wait":5000000000}`},
		{"MULLIGAN_CAPACITY_MAX_QUEUE_WAIT", "1h", []string{"max_queue_wait 1h"}, `"max_queue_wait":3600000000000`},
		{"MULLIGAN_CAPACITY_PASS_PRIORITY", "vllm", []string{"capacity {", "pass_priority vllm"}, `"pass_priority":"vllm"`},
		{"MULLIGAN_CAPACITY_PASS_PRIORITY", "sglang", []string{"pass_priority sglang"}, `"pass_priority":"sglang"`},
		{"MULLIGAN_CAPACITY_SERVER_METRICS", "http://127.0.0.1:8000/metrics", []string{"capacity {", "server_metrics http://127.0.0.1:8000/metrics vllm"}, `"url":"http://127.0.0.1:8000/metrics"`},
		{"MULLIGAN_CAPACITY_SERVER_METRICS", " http://sglang:30000/metrics  sglang ", []string{"server_metrics http://sglang:30000/metrics sglang"}, `"server":"sglang"`},
		{"MULLIGAN_CAPACITY_SERVER_METRICS", "HTTP://vllm:8000/metrics", []string{"server_metrics HTTP://vllm:8000/metrics vllm"}, `"url":"HTTP://vllm:8000/metrics"`},
		{"MULLIGAN_CAPACITY_FAIR_KEY", "{http.request.header.X-Org}\u00a0{http.request.header.X-Team}", []string{"fair_key \"{http.request.header.X-Org}\u00a0{http.request.header.X-Team}\""}, "\"fair_key\":\"{http.request.header.X-Org}\u00a0{http.request.header.X-Team}\""}, // a space Caddy splits on, though not a space or a tab
		{"MULLIGAN_CAPACITY_FAIR_KEY", "{http.request.header.X-Tenant}", []string{"capacity {", "fair_key {http.request.header.X-Tenant}"}, `"fair_key":"{http.request.header.X-Tenant}"`},
		{"MULLIGAN_CAPACITY_FAIR_KEY", "{http.request.header.X-Org} {http.request.header.X-Team}", []string{`fair_key "{http.request.header.X-Org} {http.request.header.X-Team}"`}, `"fair_key":"{http.request.header.X-Org} {http.request.header.X-Team}"`},
		{"MULLIGAN_BATCHES", "/v1", []string{"batches /v1 {", "max_file_size 200MiB", "max_requests 50000"}, `"batches":{"max_file_size":209715200,"max_requests":50000,"prefix":"/v1"}`},
		{"MULLIGAN_RESPONSES", "/v1", []string{"responses /v1 {", "retention 24h"}, `"responses":{"prefix":"/v1","retention":86400000000000}`},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			pairs := []string{"MULLIGAN_UPSTREAM", "127.0.0.1:8000"}
			c := mustLoad(t, append(pairs, tc.name, tc.value)...)
			text := c.Caddyfile()
			lines := strings.Split(text, "\n")
			for i := range lines {
				lines[i] = strings.TrimSpace(lines[i])
			}
			for _, want := range tc.lines {
				if !slices.Contains(lines, want) {
					t.Errorf("no line %q in\n%s", want, text)
				}
			}
			if js := mustAdapt(t, c); !strings.Contains(js, tc.json) {
				t.Errorf("the JSON lacks %s:\n%s", tc.json, js)
			}
		})
	}
}

// Behind PgBouncer, MULLIGAN_STORAGE names the pooler and MULLIGAN_STORAGE_DIRECT the database
// itself (docs/backends.md, "Through PgBouncer"): both by placeholder only.
func TestStorageDirectReachesTheCaddyfile(t *testing.T) {
	c := mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000", "MULLIGAN_STORAGE", "postgres://m:secret@pgbouncer:6432/m",
		"MULLIGAN_STORAGE_DIRECT", "postgres://m:secret@db:5432/m")
	text := c.Caddyfile()
	if !strings.Contains(text, "storage postgres {env.MULLIGAN_STORAGE} {\n\t\t\tdirect {env.MULLIGAN_STORAGE_DIRECT}\n\t\t}\n") || strings.Contains(text, "secret") {
		t.Fatalf("the Caddyfile:\n%s", text)
	}
	if js := mustAdapt(t, c); !strings.Contains(js, `"storage_direct":"{env.MULLIGAN_STORAGE_DIRECT}"`) {
		t.Fatalf("the JSON lacks storage_direct:\n%s", js)
	}
}

func TestEmptyValuesCountAsUnset(t *testing.T) {
	c := mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000", "MULLIGAN_LISTEN", "", "MULLIGAN_ASYNC_QUEUE", " ", "MULLIGAN_WEBHOOK_URL", "")
	if got, want := c.Caddyfile(), mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000").Caddyfile(); got != want {
		t.Fatalf("got\n%s\nwant the defaults\n%s", got, want)
	}
}

func TestBadValuesAreRefusedByName(t *testing.T) {
	for _, tc := range []struct {
		name, value string
	}{
		{"MULLIGAN_UPSTREAM", ""},
		{"MULLIGAN_UPSTREAM", "model"},
		{"MULLIGAN_UPSTREAM", "ftp://model:21"},
		{"MULLIGAN_UPSTREAM", "http://model:8000/v1"},
		{"MULLIGAN_UPSTREAM", "model:8000 other:8000"},
		{"MULLIGAN_LISTEN", "localhost"},
		{"MULLIGAN_LISTEN", ":0"},
		{"MULLIGAN_LISTEN", ":70000"},
		{"MULLIGAN_LISTEN", "bad_host!:8080"},
		{"MULLIGAN_DATA_DIR", "/data\n}\nreverse_proxy evil:80"},
		{"MULLIGAN_DATA_DIR", `/data" {`},
		{"MULLIGAN_ADMIN", "localhost:2019 {"},
		{"MULLIGAN_GRACE_PERIOD", "soon"},
		{"MULLIGAN_GRACE_PERIOD", "0s"},
		{"MULLIGAN_DURABILITY", "fast"},
		{"MULLIGAN_SCOPE", "{$HOME}"},
		{"MULLIGAN_OPERATIONS", "v1/operations"},
		{"MULLIGAN_IDEMPOTENCY_REQUIRED", "sure"},
		{"MULLIGAN_IDEMPOTENCY_TTL", "-1h"},
		{"MULLIGAN_IDEMPOTENCY_TTL", "24"},
		{"MULLIGAN_WAIT_INFLIGHT", "a while"},
		{"MULLIGAN_ASYNC_MODE", "after"},
		{"MULLIGAN_ASYNC_MODE", "after 0s"},
		{"MULLIGAN_ASYNC_MODE", "sometimes"},
		{"MULLIGAN_ASYNC_CONCURRENCY", "0"},
		{"MULLIGAN_ASYNC_CONCURRENCY", "four"},
		{"MULLIGAN_ASYNC_TIMEOUT", "10"},
		{"MULLIGAN_ASYNC_QUEUE", "-5"},
		{"MULLIGAN_STORAGE", "mysql://db/mulligan"},
		{"MULLIGAN_STORAGE", "postgres://db/mulligan {"},
		{"MULLIGAN_STORAGE_DIRECT", "postgres://db/mulligan"}, // without MULLIGAN_STORAGE=postgres://...
		{"MULLIGAN_STORAGE_DIRECT", "/data/direct"},
		{"MULLIGAN_ASYNC_TAKEOVER", "soon"},
		{"MULLIGAN_CAPACITY_LIMIT", "0"},
		{"MULLIGAN_CAPACITY_LIMIT", "auto"},
		{"MULLIGAN_CAPACITY_LIMIT", "auto 8 4"},
		{"MULLIGAN_CAPACITY_LIMIT", "many"},
		{"MULLIGAN_CAPACITY_SHARED", "16"}, // Badger storage: one replica, nothing to share
		{"MULLIGAN_CAPACITY_WAIT", "0s"},
		{"MULLIGAN_CAPACITY_WAIT", "soon"},
		{"MULLIGAN_CAPACITY_MAX_QUEUE_WAIT", "-1m"},
		{"MULLIGAN_CAPACITY_PASS_PRIORITY", "tgi"},
		{"MULLIGAN_CAPACITY_SERVER_METRICS", "127.0.0.1:8000/metrics"},
		{"MULLIGAN_CAPACITY_SERVER_METRICS", "http://127.0.0.1:8000/metrics triton"},
		{"MULLIGAN_CAPACITY_SERVER_METRICS", "http://127.0.0.1:8000/{metrics}"},
		{"MULLIGAN_CAPACITY_FAIR_KEY", `{http.request.header.X-Tenant}"`},
		{"MULLIGAN_CAPACITY_FAIR_KEY", "tenant"},                 // no placeholder: the module refuses it
		{"MULLIGAN_CAPACITY_FAIR_KEY", "{http.request.header.X"}, // braces that do not pair
		{"MULLIGAN_CAPACITY_SERVER_METRICS", "http://"},          // no host
		{"MULLIGAN_CAPACITY_SERVER_METRICS", "http:///metrics"},  // likewise
		{"MULLIGAN_BATCHES", "v1"},
		{"MULLIGAN_BATCHES", "/v1/*"},
		{"MULLIGAN_BATCHES_MAX_FILE_SIZE", "1GB"}, // without MULLIGAN_BATCHES
		{"MULLIGAN_BATCHES_MAX_REQUESTS", "10"},   // likewise
		{"MULLIGAN_RESPONSES", "v1"},
		{"MULLIGAN_RESPONSES_RETENTION", "1h"}, // without MULLIGAN_RESPONSES
		{"MULLIGAN_WEBHOOK_URL", "consumer.example.com/hook"},
		{"MULLIGAN_WEBHOOK_URL", "https://consumer.example.com/hooks/*"},
		{"MULLIGAN_WEBHOOK_ALLOW_PRIVATE", "maybe"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			pairs := []string{"MULLIGAN_UPSTREAM", "127.0.0.1:8000", "MULLIGAN_WEBHOOK_SECRET", secretNew}
			if tc.name != "MULLIGAN_WEBHOOK_URL" {
				pairs = append(pairs, "MULLIGAN_WEBHOOK_URL", "https://consumer.example.com/hook")
			}
			_, err := loadSidecarConfig(environ(append(pairs, tc.name, tc.value)...))
			if err == nil || !strings.HasPrefix(err.Error(), tc.name+" ") || strings.Count(err.Error(), "\n") > 0 {
				t.Fatalf("want one error about %s, got %v", tc.name, err)
			}
			t.Log(err)
		})
	}
}

func TestEveryBadVariableIsReportedAtOnce(t *testing.T) {
	_, err := loadSidecarConfig(environ("MULLIGAN_ASYNC_QUEUE", "many", "MULLIGAN_IDEMPOTENCY_TTL", "forever"))
	if err == nil {
		t.Fatal("no error")
	}
	for _, name := range []string{"MULLIGAN_UPSTREAM", "MULLIGAN_ASYNC_QUEUE", "MULLIGAN_IDEMPOTENCY_TTL"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%s not reported in %v", name, err)
		}
	}
}

func TestWebhookSecretsAreReadByPlaceholder(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(file, []byte(secretNew+"\n  "+secretOld+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, value, placeholder string
	}{
		{"MULLIGAN_WEBHOOK_SECRET_FILE", file, "{file." + file + "}"},
		{"MULLIGAN_WEBHOOK_SECRET", secretNew + " " + secretOld, "{env.MULLIGAN_WEBHOOK_SECRET}"},
	} {
		c := mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000",
			"MULLIGAN_WEBHOOK_URL", "https://consumer.example.com/hook", tc.name, tc.value, "MULLIGAN_WEBHOOK_ALLOW_PRIVATE", "true")
		want := "\t\twebhooks {\n" +
			"\t\t\tendpoint default https://consumer.example.com/hook {\n" +
			"\t\t\t\tsecret " + tc.placeholder + "\n" +
			"\t\t\t}\n" +
			"\t\t\tdefault default\n" +
			"\t\t\tallow_private\n" +
			"\t\t}\n" +
			"\t}\n" +
			"\treverse_proxy 127.0.0.1:8000\n" +
			"}\n"
		if got := c.Caddyfile(); !strings.HasSuffix(got, want) {
			t.Fatalf("%s: got\n%s\nwant it to end with\n%s", tc.name, got, want)
		}
	}
}

func TestBadWebhookSecretsAreRefusedWithoutShowingThem(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const leaked = "whsec_not*base64-and-secret"
	for _, tc := range []struct {
		why, blame string
		pairs      []string
	}{
		{"unreadable file", "MULLIGAN_WEBHOOK_SECRET_FILE", []string{"MULLIGAN_WEBHOOK_SECRET_FILE", filepath.Join(dir, "missing")}},
		{"empty file", "MULLIGAN_WEBHOOK_SECRET_FILE", []string{"MULLIGAN_WEBHOOK_SECRET_FILE", empty}},
		{"not a secret", "MULLIGAN_WEBHOOK_SECRET", []string{"MULLIGAN_WEBHOOK_SECRET", secretNew + " " + leaked}},
		{"both set", "MULLIGAN_WEBHOOK_SECRET", []string{"MULLIGAN_WEBHOOK_SECRET", secretNew, "MULLIGAN_WEBHOOK_SECRET_FILE", empty}},
		{"no secret", "MULLIGAN_WEBHOOK_URL", nil},
	} {
		t.Run(tc.why, func(t *testing.T) {
			pairs := append([]string{"MULLIGAN_UPSTREAM", "127.0.0.1:8000", "MULLIGAN_WEBHOOK_URL", "https://consumer.example.com/hook"}, tc.pairs...)
			_, err := loadSidecarConfig(environ(pairs...))
			if err == nil || !strings.HasPrefix(err.Error(), tc.blame+" ") {
				t.Fatalf("want an error about %s, got %v", tc.blame, err)
			}
			if strings.Contains(err.Error(), "not*base64") || strings.Contains(err.Error(), secretNew) {
				t.Fatalf("the error shows a secret: %v", err)
			}
			t.Log(err)
		})
	}
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte(secretNew), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"MULLIGAN_WEBHOOK_SECRET", "MULLIGAN_WEBHOOK_SECRET_FILE"} {
		value := map[string]string{"MULLIGAN_WEBHOOK_SECRET": secretNew, "MULLIGAN_WEBHOOK_SECRET_FILE": secretFile}[name]
		_, err := loadSidecarConfig(environ("MULLIGAN_UPSTREAM", "127.0.0.1:8000", name, value))
		if err == nil || !strings.HasPrefix(err.Error(), name+" is set without MULLIGAN_WEBHOOK_URL") {
			t.Fatalf("%s without a URL: %v", name, err)
		}
	}
}

// TestConfigHoldsNoSecret checks that neither the Caddyfile --print shows nor the JSON the
// admin API serves holds a secret.
func TestConfigHoldsNoSecret(t *testing.T) {
	const key = "0123456789abcdef0123456789abcdef"
	c := mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000", "MULLIGAN_ENCRYPTION_KEY", key,
		"MULLIGAN_WEBHOOK_URL", "https://consumer.example.com/hook", "MULLIGAN_WEBHOOK_SECRET", secretNew+" "+secretOld)
	js := mustAdapt(t, c)
	for _, text := range []string{c.Caddyfile(), js} {
		for _, secret := range []string{secretNew, secretOld, key} {
			if strings.Contains(text, secret) {
				t.Fatalf("the config shows a secret:\n%s", text)
			}
		}
	}
}

func TestEncryptionKeyStaysOutOfTheConfig(t *testing.T) {
	const key = "fedcba9876543210fedcba9876543210"
	dir := t.TempDir()
	file := filepath.Join(dir, "key")
	if err := os.WriteFile(file, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pairs []string
		line  string
	}{
		{[]string{"MULLIGAN_ENCRYPTION_KEY", key}, "encryption_key {env.MULLIGAN_ENCRYPTION_KEY}"},
		{[]string{"MULLIGAN_ENCRYPTION_KEY_FILE", file}, "encryption_key {file." + file + "}"},
	} {
		c := mustLoad(t, append([]string{"MULLIGAN_UPSTREAM", "127.0.0.1:8000"}, tc.pairs...)...)
		if text := c.Caddyfile(); !strings.Contains(text, "\t\t"+tc.line+"\n") || strings.Contains(text, key) {
			t.Fatalf("want %q and no key in\n%s", tc.line, text)
		}
		if js := mustAdapt(t, c); strings.Contains(js, key) {
			t.Fatalf("the JSON config holds the key:\n%s", js)
		}
	}

	padded := filepath.Join(dir, "padded")
	if err := os.WriteFile(padded, []byte(key+"\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		blame string
		pairs []string
	}{
		{"MULLIGAN_ENCRYPTION_KEY", []string{"MULLIGAN_ENCRYPTION_KEY", key + "\n"}},
		{"MULLIGAN_ENCRYPTION_KEY_FILE", []string{"MULLIGAN_ENCRYPTION_KEY_FILE", padded}},
		{"MULLIGAN_ENCRYPTION_KEY_FILE", []string{"MULLIGAN_ENCRYPTION_KEY_FILE", filepath.Join(dir, "missing")}},
		{"MULLIGAN_ENCRYPTION_KEY", []string{"MULLIGAN_ENCRYPTION_KEY", key, "MULLIGAN_ENCRYPTION_KEY_FILE", file}},
	} {
		_, err := loadSidecarConfig(environ(append([]string{"MULLIGAN_UPSTREAM", "127.0.0.1:8000"}, tc.pairs...)...))
		if err == nil || !strings.HasPrefix(err.Error(), tc.blame+" ") || strings.Contains(err.Error(), key) {
			t.Fatalf("%v: want an error about %s that hides the key, got %v", tc.pairs, tc.blame, err)
		}
	}
}

// TestWebhooksBlockAdapts checks the webhooks block against the module's Caddyfile parser,
// once the module has one.
func TestWebhooksBlockAdapts(t *testing.T) {
	c := mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000",
		"MULLIGAN_WEBHOOK_URL", "https://consumer.example.com/hook", "MULLIGAN_WEBHOOK_SECRET", secretNew+" "+secretOld, "MULLIGAN_WEBHOOK_ALLOW_PRIVATE", "true")
	_, _, err := c.Adapt()
	if err != nil && strings.Contains(err.Error(), `unrecognized mulligan subdirective "webhooks"`) {
		t.Skip("the module does not parse a webhooks block yet; its generation is checked as text by TestWebhookSecretsRotateFromAFile")
	}
	js := mustAdapt(t, c)
	if !strings.Contains(js, "https://consumer.example.com/hook") {
		t.Fatalf("the webhook endpoint is not in the JSON:\n%s", js)
	}
}

func TestGeneratedCaddyfileIsFormatted(t *testing.T) {
	c := mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000", "MULLIGAN_LISTEN", "127.0.0.1:8080", "MULLIGAN_SCOPE", "{http.request.header.Authorization}",
		"MULLIGAN_IDEMPOTENCY_REQUIRED", "true", "MULLIGAN_ENCRYPTION_KEY", "0123456789abcdef",
		"MULLIGAN_WEBHOOK_URL", "https://consumer.example.com/hook", "MULLIGAN_WEBHOOK_SECRET", secretNew, "MULLIGAN_WEBHOOK_ALLOW_PRIVATE", "true")
	text := c.Caddyfile()
	if formatted := string(caddyfile.Format([]byte(text))); formatted != text {
		t.Fatalf("caddy fmt would change\n%s\ninto\n%s", text, formatted)
	}
}

func TestHelpListsEveryVariableTheSidecarReads(t *testing.T) {
	read := map[string]bool{}
	lookup := environ("MULLIGAN_UPSTREAM", "127.0.0.1:8000")
	if _, err := loadSidecarConfig(func(name string) (string, bool) {
		read[name] = true
		return lookup(name)
	}); err != nil {
		t.Fatal(err)
	}
	help := sidecarHelp()
	for _, v := range sidecarVars {
		if !read[v.Name] {
			t.Errorf("%s is documented but never read", v.Name)
		}
		if !strings.Contains(help, v.Name) {
			t.Errorf("%s is not in the help", v.Name)
		}
		delete(read, v.Name)
	}
	for name := range read {
		t.Errorf("%s is read but not documented", name)
	}
}

// TestCapacityAndBatchesTogether: the 3-replica example of docs/operating.md with shared seats
// and batches, every option set, as the module reads it.
func TestCapacityAndBatchesTogether(t *testing.T) {
	c := mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000", "MULLIGAN_STORAGE", "postgres://mulligan@db/mulligan",
		"MULLIGAN_CAPACITY_LIMIT", "4", "MULLIGAN_CAPACITY_SHARED", "8", "MULLIGAN_CAPACITY_WAIT", "10s",
		"MULLIGAN_CAPACITY_MAX_QUEUE_WAIT", "30m", "MULLIGAN_BATCHES", "/v1",
		"MULLIGAN_BATCHES_MAX_FILE_SIZE", "1GiB", "MULLIGAN_BATCHES_MAX_REQUESTS", "1000")
	js := mustAdapt(t, c)
	for _, part := range []string{`"capacity":{"limit":4,"max_queue_wait":1800000000000,"shared":8,"wait":10000000000}`,
		`"batches":{"max_file_size":1073741824,"max_requests":1000,"prefix":"/v1"}`} {
		if !strings.Contains(js, part) {
			t.Errorf("the JSON lacks %s:\n%s", part, js)
		}
	}
	bad, err := loadSidecarConfig(environ("MULLIGAN_UPSTREAM", "127.0.0.1:8000", "MULLIGAN_BATCHES", "/v1",
		"MULLIGAN_BATCHES_MAX_FILE_SIZE", "200 MiB", "MULLIGAN_CAPACITY_SHARED", "8"))
	if bad != nil || err == nil || !strings.Contains(err.Error(), "MULLIGAN_BATCHES_MAX_FILE_SIZE must be a positive size") ||
		!strings.Contains(err.Error(), "MULLIGAN_CAPACITY_SHARED applies to PostgreSQL storage only") {
		t.Fatalf("want both mistakes named, got %v", err)
	}
}

// TestStartLogNamesTheStorageInUse: with MULLIGAN_STORAGE=postgres://... the start-up line said
// "storage":"/var/lib/mulligan", the Badger directory it does not use.
func TestStartLogNamesTheStorageInUse(t *testing.T) {
	pg := mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000", "MULLIGAN_STORAGE", "postgres://u:secret@db/m")
	if got := pg.storageName(); got != "postgres (MULLIGAN_STORAGE)" {
		t.Fatalf("storage logged as %q", got)
	}
	if got := mustLoad(t, "MULLIGAN_UPSTREAM", "127.0.0.1:8000").storageName(); got != "/var/lib/mulligan" {
		t.Fatalf("Badger storage logged as %q", got)
	}
}

// The model server's metrics steer limit auto: beside a fixed MULLIGAN_CAPACITY_LIMIT they are
// refused at start, naming the variable, as the module refuses the Caddyfile.
func TestEnvServerMetricsBesideAFixedLimitIsRefused(t *testing.T) {
	_, err := loadSidecarConfig(environ("MULLIGAN_UPSTREAM", "127.0.0.1:8000", "MULLIGAN_CAPACITY_LIMIT", "4",
		"MULLIGAN_CAPACITY_SERVER_METRICS", "http://127.0.0.1:8000/metrics"))
	if err == nil || !strings.HasPrefix(err.Error(), "MULLIGAN_CAPACITY_SERVER_METRICS ") {
		t.Fatalf("want an error about MULLIGAN_CAPACITY_SERVER_METRICS, got %v", err)
	}
}

package module

import (
	"bytes"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

func TestEncryptionKeyHasOneEncoding(t *testing.T) {
	hex32 := "00112233445566778899aabbccddeeff"
	for _, tc := range []struct {
		in      string
		want    []byte
		message string // for a refused key: what the message must say
	}{
		{in: "hex:" + hex32, want: []byte("\x00\x11\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\xcc\xdd\xee\xff")},
		{in: "base64:AAECAwQFBgcICQoLDA0ODw==", want: []byte("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f")},
		{in: "raw:" + hex32, want: []byte(hex32)},
		{in: "a-raw-key-of-32-bytes-exactly!!!", want: []byte("a-raw-key-of-32-bytes-exactly!!!")},
		{in: hex32, message: "32 hex digits are ambiguous; write hex:<key> for the 16-byte key"},
		{in: strings.Repeat("ab", 32), message: "64 hex digits are ambiguous"},
		{in: "hex:abcd", message: "must be 16, 24 or 32 bytes"},
		{in: "hex:zz", message: "encryption_key: encoding/hex"},
		{in: "too short", message: "must be 16, 24 or 32 bytes"},
	} {
		got, err := parseEncryptionKey(tc.in)
		switch {
		case tc.message != "" && (err == nil || !strings.Contains(err.Error(), tc.message)):
			t.Errorf("%q: error %v, want one saying %q", tc.in, err, tc.message)
		case tc.message == "" && (err != nil || !bytes.Equal(got, tc.want)):
			t.Errorf("%q: %x, %v; want %x", tc.in, got, err, tc.want)
		}
	}
}

func TestOperationsPathThatSwallowsTheSiteIsRefused(t *testing.T) {
	for _, tc := range []struct{ path, message string }{
		{"/", `operations "/" would serve every request of the site as the operations API`},
		{"//", `would serve every request of the site`},
		{"/v1/*", "must be a plain path prefix"},
		{"v1/operations", "must be a path starting with /"},
	} {
		cf := "{\n admin off\n auto_https off\n persist_config off\n}\nhttp://127.0.0.1:0 {\n mulligan {\n  storage " + t.TempDir() + "\n  operations " + tc.path + "\n }\n respond ok\n}\n"
		cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
		if err == nil {
			err = caddy.Load(cfg, true)
		}
		if err == nil {
			_ = caddy.Stop()
			t.Errorf("operations %q was accepted", tc.path)
			continue
		}
		if !strings.Contains(err.Error(), tc.message) {
			t.Errorf("operations %q: %v; want a message saying %q", tc.path, err, tc.message)
		}
	}
}

// A storage's direct DSN (`storage postgres <dsn> { direct <dsn> }`, docs/backends.md) is
// checked when the config loads, before any database is reached; its error never shows it.
func TestStorageDirectIsCheckedAtLoad(t *testing.T) {
	for _, tc := range []struct{ storage, message string }{
		{"storage postgres postgres://u@127.0.0.1:1/db {\n   direct \"postgres://u:s3cret@db:notaport/m\"\n  }", "storage postgres: direct: "},
		{"storage postgres postgres://u@127.0.0.1:1/db {\n   direct {env.MULLIGAN_TEST_UNSET_DIRECT}\n  }", "direct needs a DSN"},
	} {
		cf := "{\n admin off\n auto_https off\n persist_config off\n}\nhttp://127.0.0.1:0 {\n mulligan {\n  " + tc.storage + "\n }\n respond ok\n}\n"
		cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
		if err == nil {
			err = caddy.Load(cfg, true)
		}
		if err == nil {
			_ = caddy.Stop()
			t.Errorf("%s was accepted", tc.storage)
			continue
		}
		if !strings.Contains(err.Error(), tc.message) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: %v; want a message saying %q, without the password", tc.storage, err, tc.message)
		}
	}
	if _, err := directOf(BackendBadger, "postgres://db/m"); err == nil || !strings.Contains(err.Error(), "applies to storage postgres only") {
		t.Errorf("storage_direct with Badger: %v", err)
	}
}

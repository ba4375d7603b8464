package module

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// TestPostgresPasswordNeverShows opens a PostgreSQL storage through DSNs spelling the password
// in each way libpq takes it, and looks for the password in the log (at debug), /metrics, the
// admin API, and the error of a DSN that does not parse (docs/backends.md).
func TestPostgresPasswordNeverShows(t *testing.T) {
	base, err := url.Parse(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	kv := fmt.Sprintf("host=%s port=%s user=%s dbname=%s", base.Hostname(), base.Port(), base.User.Username(), strings.TrimPrefix(base.Path, "/"))
	withPassword := *base
	withPassword.User = url.UserPassword(base.User.Username(), "s3cret-url")
	want := fmt.Sprintf("postgres://%s@%s%s", base.User.Username(), base.Host, base.Path)
	for _, tc := range []struct{ dsn, secret string }{
		{kv + " password = s3cret-spaced", "s3cret-spaced"},
		{kv + " password='two words-quoted'", "words-quoted"},
		{kv + " password = 'spaced and quoted'", "spaced and quoted"},
		{withPassword.String(), "s3cret-url"},
	} {
		logFile := filepath.Join(t.TempDir(), "caddy.log")
		g := startGatewayWithGlobals(t, modelserver.Config{}, fmt.Sprintf("log {\n output file %s\n level DEBUG\n }", logFile),
			"storage postgres `"+tc.dsn+"`")
		_, op := g.submit(t, "")
		g.await(t, op.OperationID)
		seen := map[string]string{
			"/metrics":               g.adminCall("GET", "/metrics"),
			"/mulligan/stats":        g.adminCall("GET", "/mulligan/stats"),
			"the error of a bad DSN": loadError(t, g, "storage postgres `"+tc.dsn+" sslmode='unterminated`"),
		}
		_ = caddy.Stop()
		logs, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		seen["the log"] = string(logs)
		for where, text := range seen {
			if strings.Contains(text, tc.secret) {
				t.Errorf("DSN %q: the password shows in %s: %.300s", tc.dsn, where, text[max(0, strings.Index(text, tc.secret)-200):])
			}
		}
		if !strings.Contains(seen["/mulligan/stats"], want) {
			t.Errorf("DSN %q: the stats do not name the storage %s: %s", tc.dsn, want, seen["/mulligan/stats"])
		}
		g = startGatewayWithGlobals(t, modelserver.Config{}, "", "storage postgres `"+tc.dsn+"`")
		if list := g.adminCall("GET", "/mulligan/operations?storage="+url.QueryEscape(want)); !strings.Contains(list, op.OperationID) {
			t.Errorf("DSN %q: the storage picked by its name lacks %s: %s", tc.dsn, op.OperationID, list)
		}
	}
}

// loadError loads a config with the given mulligan block, which must fail, and returns why.
func loadError(t *testing.T, g *gateway, mulliganBody string) string {
	t.Helper()
	err := caddy.Load(g.config(mulliganBody), true)
	if err == nil {
		t.Fatalf("a config with %s loaded", mulliganBody)
	}
	return err.Error()
}

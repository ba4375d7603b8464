package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	osexec "os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// Bouncer is a PgBouncer of one test's own, in transaction pooling mode, in front of a test
// cluster (docs/backends.md, "Through PgBouncer"): Debian's pgbouncer, started on a free
// loopback port with a configuration in a temporary directory, stopped when the test ends.
type Bouncer struct {
	// Port is where it listens, on 127.0.0.1.
	Port int
	// Pool is its server connections per database: default_pool_size and max_db_connections.
	Pool int
	dir  string
}

// StartBouncer starts a PgBouncer in transaction mode in front of the cluster that server (a
// DSN on it) names, with pool server connections per database whatever the number of clients.
// Without the pgbouncer binary t is skipped, saying how to install it; under CI=true it fails.
// Run as root, PgBouncer (which refuses root) runs as the postgres user.
func StartBouncer(t testing.TB, server string, pool int) *Bouncer {
	t.Helper()
	bin := bouncerBinary()
	if bin == "" {
		msg := "pgbouncer not found: apt-get install pgbouncer (Debian's; the tests start their own, the package's service may stay stopped)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cfg, err := pgx.ParseConfig(server)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "mulligan-pgbouncer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	b := &Bouncer{Port: testkit.FreePorts(t, 1)[0], Pool: pool, dir: dir}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = %s
pool_mode = transaction
default_pool_size = %d
max_db_connections = %d
max_client_conn = 2000
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
`, cfg.Host, cfg.Port, b.Port, filepath.Join(dir, "users.txt"), cfg.User, pool, pool,
		filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": fmt.Sprintf("%q \"\"\n", cfg.User)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := osexec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Getuid() == 0 {
		cmd.SysProcAttr.Credential = postgresUser(t, dir)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	testkit.WaitFor(t, 20*time.Second, "pgbouncer accepting connections", func() bool {
		select {
		case <-exited:
			t.Fatalf("pgbouncer exited: %s", b.Log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, b.DSN(t, server)+"&default_query_exec_mode=simple_protocol")
		if err != nil {
			return false
		}
		_ = conn.Close(ctx)
		return true
	})
	return b
}

// DSN is dsn (a URL on the cluster behind the pooler) through the pooler.
func (b *Bouncer) DSN(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("pgtest: a pooled DSN needs a postgres:// URL: %v", err)
	}
	u.Host = "127.0.0.1:" + strconv.Itoa(b.Port)
	if u.RawQuery == "" {
		u.RawQuery = "sslmode=disable"
	}
	return u.String()
}

// Log is what PgBouncer logged so far.
func (b *Bouncer) Log() string {
	out, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return string(out)
}

// bouncerBinary finds pgbouncer on the PATH or where Debian puts it.
func bouncerBinary() string {
	if p, err := osexec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	return ""
}

// postgresUser is the postgres user's credential, dir handed to it.
func postgresUser(t testing.TB, dir string) *syscall.Credential {
	t.Helper()
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("running pgbouncer as root's stand-in: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, uid, gid)
	}); err != nil {
		t.Fatal(err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// ServerConnections counts the connections the cluster serves to database name other than
// the asking one: the pooler's server connections plus any direct ones.
func ServerConnections(t testing.TB, dsn string) int {
	t.Helper()
	return Count(t, dsn, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`)
}

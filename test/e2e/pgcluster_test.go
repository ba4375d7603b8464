package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"

	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// pgCluster is a PostgreSQL cluster of one test's own, which the test may stop and start on
// the same data directory (as scripts/pg-test-cluster.sh makes one for the whole run).
type pgCluster struct {
	t      *testing.T
	bindir string
	dir    string
	port   int
	as     []string // runs a command as the postgres user when the tests run as root
	DSN    string
}

// ownCluster initialises and starts a throw-away cluster; without PostgreSQL's binaries the
// test is skipped, saying how to install them, and under CI=true it fails instead.
func ownCluster(t *testing.T) *pgCluster {
	t.Helper()
	bindir := pgBindir()
	if bindir == "" {
		msg := "PostgreSQL binaries (initdb, pg_ctl) not found: apt-get install postgresql"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir, err := os.MkdirTemp("", "mulligan-pg-own")
	if err != nil {
		t.Fatal(err)
	}
	c := &pgCluster{t: t, bindir: bindir, dir: dir}
	if os.Getuid() == 0 {
		c.as = []string{"runuser", "-u", "postgres", "--"}
		c.run("chown", "postgres:", dir)
	}
	c.run(c.cmd("initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")...)
	c.port = testkit.FreePorts(t, 1)[0]
	c.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	c.Start()
	t.Cleanup(func() {
		argv := c.cmd("pg_ctl", "-D", filepath.Join(dir, "data"), "-m", "immediate", "-w", "stop")
		_ = exec.Command(argv[0], argv[1:]...).Run()
		_ = os.RemoveAll(dir)
	})
	return c
}

// Start starts the cluster on its data directory and waits until it accepts connections.
func (c *pgCluster) Start() {
	c.t.Helper()
	c.run(c.cmd("pg_ctl", "-D", filepath.Join(c.dir, "data"), "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60",
		"-o", fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=on -c synchronous_commit=on", c.port, c.dir), "start")...)
}

// Stop shuts the cluster down (fast: open connections are cut, as in a failover or a restart).
func (c *pgCluster) Stop() {
	c.t.Helper()
	c.run(c.cmd("pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", "fast", "-w", "stop")...)
}

func (c *pgCluster) cmd(tool string, args ...string) []string {
	return append(append(append([]string(nil), c.as...), filepath.Join(c.bindir, tool)), args...)
}

func (c *pgCluster) run(argv ...string) {
	c.t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		c.t.Fatalf("%v: %v\n%s\n%s", argv, err, out, log)
	}
}

// pgBindir finds PostgreSQL's server binaries: on the PATH, or Debian's newest.
func pgBindir() string {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if _, err := exec.LookPath("initdb"); err == nil {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d
		}
	}
	return ""
}

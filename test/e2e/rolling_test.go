package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/store/postgres"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// previousRelease is the last landed release, which this one must run beside during a rolling
// upgrade (docs/backends.md, "Rolling upgrades").
const previousRelease = "e8235a7"

// buildPreviousRelease builds the previous release's sidecar from git history. Without the
// history (a source tarball) the test is skipped, saying so; under CI=true it fails instead.
func buildPreviousRelease(t *testing.T) string {
	t.Helper()
	unavailable := func(why string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf("the previous release %s cannot be built: ", previousRelease) + fmt.Sprintf(why, args...)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		unavailable("no git work tree here (%v)", err)
	}
	root := strings.TrimSpace(string(top))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", previousRelease+"^{commit}").Run(); err != nil {
		unavailable("the git history lacks it")
	}
	dir := t.TempDir()
	if out, err := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, previousRelease, dir).CombinedOutput(); err != nil {
		t.Fatalf("extracting %s: %v\n%s", previousRelease, err, out)
	}
	bin := filepath.Join(dir, "mulligan-"+previousRelease)
	build := exec.Command("go", "build", "-o", bin, "./sidecar")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", previousRelease, err, out)
	}
	return bin
}

// The previous release and this one share one PostgreSQL, as during a rolling upgrade: the
// previous one starts first (the database is at its schema), this one migrates beside it. Keys
// claimed through either replay through both, byte for byte, streams included (never empty),
// and operations accepted by either finish, polled through the other.
func TestPreviousReleaseRunsBesideThisOne(t *testing.T) {
	t.Parallel()
	prev := buildPreviousRelease(t)
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{Latency: 50 * time.Millisecond})
	old := newReplica(t, upstream, dsn, "")
	old.bin = prev
	old.start()
	cur := newReplica(t, upstream, dsn, "")
	cur.start()
	rs := map[string]*replica{"previous": old, "current": cur}
	for name, r := range rs {
		key := "json-" + name
		resp, first, err := r.post(key, key, 10*time.Second)
		if err != nil || resp.StatusCode != 200 || len(first) == 0 {
			t.Fatalf("a keyed call through the %s release: %v %v %s", name, err, resp, first)
		}
		for other, o := range rs {
			resp, body, err := o.post(key, key, 10*time.Second)
			if err != nil || resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || string(body) != string(first) {
				t.Fatalf("a key claimed through the %s release, replayed through the %s one: %v %v %q", name, other, err, resp, body)
			}
		}
	}
	for name, r := range rs {
		key := "stream-" + name
		first, err := sseEvents(bufio.NewReader(r.openStream(t, key).Body), 0)
		if err != nil || len(first) < 3 {
			t.Fatalf("a keyed stream through the %s release: %d events, %v", name, len(first), err)
		}
		for other, o := range rs {
			resp := o.openStream(t, key)
			again, err := sseEvents(bufio.NewReader(resp.Body), 0)
			if err != nil || resp.Header.Get("Idempotent-Replayed") != "true" || strings.Join(again, "") != strings.Join(first, "") {
				t.Fatalf("a stream recorded through the %s release, replayed through the %s one: %d of %d events, %v",
					name, other, len(again), len(first), err)
			}
		}
	}
	for name, r := range rs {
		op := r.submit(t, "op-"+name)
		for other, o := range rs {
			if got := o.await(t, op.OperationID, 30*time.Second); got.Status != "succeeded" {
				t.Fatalf("an operation accepted through the %s release, polled through the %s one: %s %+v", name, other, got.Status, got.Error)
			}
		}
	}
	for key, n := range model.Stats().ByKey {
		if n != 1 {
			t.Errorf("%s ran %d times upstream", key, n)
		}
	}
}

// This binary refuses to start on a database a newer release migrated past what it can read,
// and says why.
func TestBinaryRefusesADatabaseOfANewerSchema(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Database(t)
	_, upstream := startModelServer(t, modelserver.Config{})
	ctx := context.Background()
	st, err := postgres.Open(ctx, postgres.Options{DSN: dsn, SweepEvery: -1}) // this binary's schema
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	next := postgres.MaxSchema + 1
	if _, err := db.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, 'from a newer release')`, next); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE schema_compat SET readable_by = $1`, next); err != nil {
		t.Fatal(err)
	}
	r := newReplica(t, upstream, dsn, "")
	run := exec.Command(binary, "run", "--config", filepath.Join(r.dataDir, "Caddyfile"), "--adapter", "caddyfile")
	run.Env = r.env
	done := make(chan error, 1)
	var out strings.Builder
	run.Stdout, run.Stderr = &out, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- run.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		_ = run.Process.Kill()
		<-done
		t.Fatalf("still running 30s on a database of schema %d; its log:\n%s", next, out.String())
	}
	want := fmt.Sprintf("readable only by binaries of schema %d or newer; this binary knows schema %d at most", next, postgres.MaxSchema)
	if err == nil || !strings.Contains(out.String(), want) {
		t.Fatalf("exit %v; want a refusal saying %q; its log:\n%s", err, want, out.String())
	}
}

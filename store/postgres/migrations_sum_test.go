package postgres

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"strings"
	"testing"
)

// A migration is never changed once committed: a database it migrated never runs it again, so a
// change reaches only new databases and leaves the others behind (an unreleased build's 0018,
// rewritten after it had migrated a developer's database, failed every claim there for a
// missing column; 0019 mended it). testdata/migrations.sum holds each file's SHA-256: a new
// migration adds its line (sha256sum *.sql in migrations/), and a change to a file already there
// fails here. Complete a schema with a new migration instead.
func TestMigrationsAreNeverRewritten(t *testing.T) {
	raw, err := os.ReadFile("testdata/migrations.sum")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("testdata/migrations.sum: a line is not \"<sha256>  <file>\": %q", line)
		}
		want[name] = sum
	}
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		body, err := migrations.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "migrations/")
		got := sha256.Sum256(body)
		switch sum, ok := want[name]; {
		case !ok:
			t.Errorf("%s is not in testdata/migrations.sum: add its line (sha256sum %s)", name, name)
		case sum != hex.EncodeToString(got[:]):
			t.Errorf("%s changed since it was committed: a database it migrated will not run it again; undo the change and add a migration", name)
		}
		delete(want, name)
	}
	for name := range want {
		t.Errorf("%s is in testdata/migrations.sum but not among the migrations: a migration is never removed", name)
	}
}

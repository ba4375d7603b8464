package consumer

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mulligan-gw/mulligan/webhook"
)

func TestTornLastLineIsCutOffAtStart(t *testing.T) {
	dir := t.TempDir()
	first := start(t, dir, Config{})
	first.deliver("evt_1", event("evt_1", "op_1", "succeeded", 3))
	first.waitIdle()
	first.stop()

	path := filepath.Join(dir, journalFile)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"kind":"received","id":"evt_2","ev`) // a crash in the middle of a write
	f.Close()

	second := start(t, dir, Config{})
	if got := second.deliver("evt_2", event("evt_2", "op_2", "succeeded", 3)); got != http.StatusOK {
		t.Fatalf("status %d, want 200", got)
	}
	second.waitIdle()
	if got := versionsOf(second.processed.all()); len(got) != 1 || got[0] != "op_2@3" {
		t.Errorf("processed %v, want [op_2@3]", got)
	}
	second.stop()

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n"); len(lines) != 4 {
		t.Errorf("journal has %d lines, want 4 (received and processed, twice):\n%s", len(lines), data)
	}
}

func TestCorruptJournalRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, journalFile), []byte("not json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Secrets: []webhook.Secret{testSecret(t, "c")}, Dir: dir}); err == nil {
		t.Fatal("New opened a corrupt journal")
	}
}

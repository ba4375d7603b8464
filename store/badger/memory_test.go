package badger

import (
	"strings"
	"testing"
)

// TestMemorySettingsAreCheckedAtOpen: a setting out of Badger's bounds is refused, naming it.
func TestMemorySettingsAreCheckedAtOpen(t *testing.T) {
	for _, m := range []Memory{{MemTableSize: 1000}, {MemTables: 17}, {BlockCache: 1}, {IndexCache: 32 << 30}, {ValueLogFileSize: 2 << 30}} {
		_, err := Open(Options{Dir: t.TempDir(), Memory: m})
		if err == nil {
			t.Fatalf("%+v opened", m)
		}
		if name := strings.Fields(err.Error())[1]; !strings.Contains("memtable_size memtables block_cache index_cache value_log_file_size", name) {
			t.Fatalf("%+v: %v, want the setting named", m, err)
		}
	}
}

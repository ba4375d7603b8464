package badger

import "fmt"

// Memory sizes what Badger holds in memory and maps (docs/backends.md, "Badger's memory"). Its
// resident share is about MemTables x MemTableSize twice (each memtable's arena, and its log
// mapped), plus BlockCache and IndexCache, plus the newest value log's pages (at most
// ValueLogFileSize), plus what the older value logs and the tables keep between page-outs
// (residentSlack and residentGrowth, resident.go). None of it grows with what the database holds.
type Memory struct {
	// MemTableSize is one memtable's size: writes gather there before a flush to a table.
	MemTableSize int64
	// MemTables is how many memtables may exist at once (one written, the others flushing);
	// writes stall when all are full.
	MemTables int
	// BlockCache caches the tables' decompressed blocks.
	BlockCache int64
	// IndexCache caches the tables' indexes and bloom filters.
	IndexCache int64
	// ValueLogFileSize is the size at which a value log file is finished and the next begun:
	// values above 1 KiB (results, requests, file chunks) are written there.
	ValueLogFileSize int64
}

// DefaultMemory is what a zero Memory field takes: about 125 MiB resident at most for Badger
// (docs/backends.md).
var DefaultMemory = Memory{MemTableSize: 8 << 20, MemTables: 3, BlockCache: 16 << 20, IndexCache: 8 << 20, ValueLogFileSize: 32 << 20}

// Bounds of the Memory settings: Badger's own (a value log under 2 GiB, at least 1 MiB), and
// the least that keeps a database usable. A transaction must fit in 15 % of a memtable, and the
// largest the gateway writes is a chunk of a batch's lines (500 operations with their
// requests, about 1 MB when their bodies are just under the value threshold): MinMemTableSize
// holds it (internal/batches' TestWorkerChunkFitsTheSmallestMemtable).
const (
	MinMemTableSize   = 8 << 20
	minMemorySize     = 1 << 20
	maxMemTableSize   = 1 << 30
	maxMemTables      = 16
	maxCacheSize      = 16 << 30
	maxValueLogFileSz = 2<<30 - 1
)

// Check reports the first setting out of its bounds (zero fields are unset: the default).
func (m Memory) Check() error {
	for _, c := range []struct {
		name        string
		v, min, max int64
	}{
		{"memtable_size", m.MemTableSize, MinMemTableSize, maxMemTableSize},
		{"block_cache", m.BlockCache, minMemorySize, maxCacheSize},
		{"index_cache", m.IndexCache, minMemorySize, maxCacheSize},
		{"value_log_file_size", m.ValueLogFileSize, minMemorySize, maxValueLogFileSz},
	} {
		if c.v != 0 && (c.v < c.min || c.v > c.max) {
			return fmt.Errorf("%s must be from %dMiB to %dMiB, got %d bytes", c.name, c.min>>20, c.max>>20, c.v)
		}
	}
	if m.MemTables < 0 || m.MemTables > maxMemTables {
		return fmt.Errorf("memtables must be from 1 to %d, got %d", maxMemTables, m.MemTables)
	}
	return nil
}

// withDefaults is m with DefaultMemory's value in each unset field.
func (m Memory) withDefaults() Memory {
	d := DefaultMemory
	if m.MemTableSize == 0 {
		m.MemTableSize = d.MemTableSize
	}
	if m.MemTables == 0 {
		m.MemTables = d.MemTables
	}
	if m.BlockCache == 0 {
		m.BlockCache = d.BlockCache
	}
	if m.IndexCache == 0 {
		m.IndexCache = d.IndexCache
	}
	if m.ValueLogFileSize == 0 {
		m.ValueLogFileSize = d.ValueLogFileSize
	}
	return m
}

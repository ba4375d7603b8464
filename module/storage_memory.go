package module

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/mulligan-gw/mulligan/store/badger"
)

// BadgerMemory sizes Badger's memory (docs/backends.md, "Badger's memory"): `storage badger
// <dir> { memtable_size ... }`. A zero field takes the default.
type BadgerMemory struct {
	// MemTableSize is one memtable's size. Default: 8 MiB.
	MemTableSize int64 `json:"memtable_size,omitempty"`
	// MemTables is how many memtables may exist at once (1 to 16). Default: 3.
	MemTables int `json:"memtables,omitempty"`
	// BlockCache caches the tables' blocks. Default: 16 MiB.
	BlockCache int64 `json:"block_cache,omitempty"`
	// IndexCache caches the tables' indexes and bloom filters. Default: 8 MiB.
	IndexCache int64 `json:"index_cache,omitempty"`
	// ValueLogFileSize is the size of one value-log file (1 MiB to 2 GiB). Default: 32 MiB.
	ValueLogFileSize int64 `json:"value_log_file_size,omitempty"`
}

// badger is m as the Badger backend takes it, checked; settings on PostgreSQL are refused.
func (m *BadgerMemory) badger(backend string) (badger.Memory, error) {
	if m == nil {
		return badger.Memory{}, nil
	}
	if backend != BackendBadger {
		return badger.Memory{}, errors.New("memtable_size, memtables, block_cache, index_cache and value_log_file_size apply to storage badger only")
	}
	mem := badger.Memory{MemTableSize: m.MemTableSize, MemTables: m.MemTables, BlockCache: m.BlockCache,
		IndexCache: m.IndexCache, ValueLogFileSize: m.ValueLogFileSize}
	if err := mem.Check(); err != nil {
		return badger.Memory{}, fmt.Errorf("storage badger: %w", err)
	}
	return mem, nil
}

// explicit are the settings m sets, by name, as storage-wide settings to compare across blocks.
func (m *BadgerMemory) explicit() map[string]string {
	out := map[string]string{}
	if m == nil {
		return out
	}
	for name, v := range map[string]int64{"memtable_size": m.MemTableSize, "memtables": int64(m.MemTables),
		"block_cache": m.BlockCache, "index_cache": m.IndexCache, "value_log_file_size": m.ValueLogFileSize} {
		if v != 0 {
			out[name] = strconv.FormatInt(v, 10)
		}
	}
	return out
}

// mergeMemory is into with the setting `name` taken from from.
func mergeMemory(into, from badger.Memory, name string) badger.Memory {
	switch name {
	case "memtable_size":
		into.MemTableSize = from.MemTableSize
	case "memtables":
		into.MemTables = from.MemTables
	case "block_cache":
		into.BlockCache = from.BlockCache
	case "index_cache":
		into.IndexCache = from.IndexCache
	case "value_log_file_size":
		into.ValueLogFileSize = from.ValueLogFileSize
	}
	return into
}

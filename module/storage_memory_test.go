package module

import (
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestBlocksOnOneStorageMustAgreeOnBadgersMemory: Badger's memory settings are storage-wide, as
// durability is: a second block setting one differently is refused naming it, one agreeing or
// silent shares the storage, and the storage opens with what the blocks set.
func TestBlocksOnOneStorageMustAgreeOnBadgersMemory(t *testing.T) {
	block := func(mem *BadgerMemory) blockSpec {
		h := Handler{StorageMemory: mem, Async: &AsyncConfig{}}
		set, err := h.spec(nil)
		if err != nil {
			t.Fatal(err)
		}
		return blockSpec{set: set, explicit: h.storageWideSettings()}
	}
	ref := newStorageRef(newRegistry(), block(nil).set, zap.NewNop())
	if err := ref.join(block(&BadgerMemory{MemTables: 2, BlockCache: 8 << 20})); err != nil {
		t.Fatal(err)
	}
	if err := ref.join(block(&BadgerMemory{MemTables: 2})); err != nil {
		t.Fatalf("an agreeing block refused: %v", err)
	}
	if err := ref.join(block(nil)); err != nil {
		t.Fatalf("a silent block refused: %v", err)
	}
	err := ref.join(block(&BadgerMemory{MemTables: 4}))
	if err == nil || !strings.Contains(err.Error(), "set memtables differently (2 and 4)") {
		t.Fatalf("a disagreeing block: %v, want it refused naming memtables", err)
	}
	if m := ref.set.memory; m.MemTables != 2 || m.BlockCache != 8<<20 {
		t.Fatalf("the storage opens with %+v, want what the blocks set", m)
	}
}

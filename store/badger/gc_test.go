package badger

import (
	"testing"
	"time"
)

// The value-log GC holds an iterator until a sync made its moves durable, then lets go: the
// store stays usable, and a write after it commits and syncs.
func TestValueLogGCReleasesWhatItHolds(t *testing.T) {
	st := openTemp(t, true)
	st.sh.collectValueLogs()
	if st.sh.db.IsClosed() {
		t.Fatal("the database closed")
	}
	if _, err := st.ClaimKey(keyA, fpA, time.Minute); err != nil {
		t.Fatalf("a claim after the GC: %v", err)
	}
}

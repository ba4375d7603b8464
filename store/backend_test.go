package store_test

import (
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

func TestBadgerConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Storage {
		dir := t.TempDir()
		return func(now func() time.Time) store.Backend {
			st, err := store.Open(store.Options{Dir: dir, Sync: true, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			return st
		}
	})
}

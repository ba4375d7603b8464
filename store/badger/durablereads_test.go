package badger

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/storetest"
)

// Under durability sync a reader sees a write only once a sync covered it: the suite's cases
// hold the WAL's sync open and read meanwhile.
func TestReadsSeeOnlyDurableWrites(t *testing.T) {
	storetest.RunDurableReads(t, func(t *testing.T, now func() time.Time) (store.Backend, storetest.SyncHold) {
		st, err := Open(Options{Dir: t.TempDir(), Sync: true, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st, holdSyncs(st)
	})
}

// holdSyncs holds the next sync of st's database at its WAL, the last file it syncs.
func holdSyncs(st *Store) storetest.SyncHold {
	d, g := st.sh.durable, st.sh.syncer
	return storetest.SyncHold{
		Hold: func() (<-chan struct{}, func()) {
			held, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			d.mu.Lock() // the sync reads datasync under it
			defer d.mu.Unlock()
			next := d.datasync
			d.datasync = func(path string) error {
				if strings.HasSuffix(path, ".mem") {
					once.Do(func() { close(held); <-release })
				}
				return next(path)
			}
			return held, func() { close(release) }
		},
		Waiting: func() int {
			g.mu.Lock()
			defer g.mu.Unlock()
			return len(g.waiters)
		},
	}
}

// A recorded response whose sync failed is committed all the same: a duplicate then replays it
// only once a later sync made it durable, never on the strength of the commit alone.
func TestAReplayWhoseSyncFailedWaitsForALaterSync(t *testing.T) {
	st, err := Open(Options{Dir: t.TempDir(), Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key, fp := strings.Repeat("k", 32), strings.Repeat("f", 32)
	c, err := st.ClaimKey([]byte(key), []byte(fp), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	d := st.sh.durable
	held, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	syncs := 0
	d.mu.Lock()
	next := d.datasync
	d.datasync = func(path string) error {
		if !strings.HasSuffix(path, ".mem") {
			return next(path)
		}
		switch syncs++; syncs {
		case 1:
			return errors.New("injected: the disk refused the WAL")
		case 2:
			close(held)
			<-release
		}
		return next(path)
	}
	d.mu.Unlock()
	if err := st.CompleteKey([]byte(key), c.Token, store.Response{Status: 200}, time.Now().Add(time.Hour)); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("completing with the sync failing: %v, want ErrUnavailable", err)
	}
	replay := make(chan store.Claim, 1)
	go func() {
		c, err := st.ClaimKey([]byte(key), []byte(fp), time.Minute)
		if err != nil {
			t.Error(err)
		}
		replay <- c
	}()
	select {
	case <-held:
	case c := <-replay:
		t.Fatalf("the duplicate got %v without a sync of the record", c.Outcome)
	case <-time.After(10 * time.Second):
		t.Fatal("the duplicate neither answered nor waited for a sync")
	}
	release <- struct{}{}
	if c := <-replay; c.Outcome != store.Replay {
		t.Fatalf("after the sync, the duplicate got %v, want a replay", c.Outcome)
	}
}

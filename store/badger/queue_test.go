package badger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/mulligan-gw/mulligan/store"
)

func TestQueuedOperationLostFromMemoryStillRuns(t *testing.T) {
	st := openTemp(t, true)
	if _, err := st.AcceptOperation(newOp("op_1"), &store.Request{}, nil); err != nil {
		t.Fatal(err)
	}
	// The in-memory enqueue is lost (as after an fsync error following the commit).
	q := st.sh.queue
	q.mu.Lock()
	q.order, q.rebuiltAt = newQueueOrder(), time.Time{}
	delete(q.queued, "op_1")
	q.mu.Unlock()
	op, err := st.ClaimNext("w1", time.Minute)
	if err != nil || op == nil || op.ID != "op_1" || op.Holder != "w1" {
		t.Fatalf("claimed %+v, %v; want op_1 held by w1", op, err)
	}
}

func TestOperationsLeftRunningByACrashAreExpiredAtOnce(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(Options{Dir: dir, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.AcceptOperation(newOp("op_1"), &store.Request{}, nil); err != nil {
		t.Fatal(err)
	}
	if op, err := st.ClaimNext("w1", time.Hour); err != nil || op == nil {
		t.Fatalf("claim: %v %v", op, err)
	}
	if exp, _ := st.ExpiredLeases(10); len(exp) != 0 {
		t.Fatalf("a live worker's lease expired: %v", ids(exp))
	}
	_ = st.Close()
	st, err = Open(Options{Dir: dir, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// A worker of the new process by the same name does not make the old lease live.
	if op, err := st.ClaimNext("w1", time.Hour); err != nil || op != nil {
		t.Fatalf("claim after restart: %v %v", op, err)
	}
	exp, err := st.ExpiredLeases(10)
	if err != nil || len(exp) != 1 || exp[0].ID != "op_1" || exp[0].Holder != "w1" {
		t.Fatalf("after restart: %v %v; want op_1, held by w1 an hour longer, expired", ids(exp), err)
	}
	if _, err := st.Transition("op_1", store.Change{To: store.StatusQueued, Holder: "w1", LeaseExpired: true}); err != nil {
		t.Fatal(err)
	}
	if queued, running, _ := st.QueueStats(); queued != 1 || running != 0 {
		t.Fatalf("queued %d running %d", queued, running)
	}
}

func TestDurableSyncCoversRotatedWALsAndValueLogs(t *testing.T) {
	st := openTemp(t, true)
	dir := t.TempDir()
	// Past 99999 the names no longer sort as the ids: 100000.mem is the newest.
	for _, name := range []string{"99999.mem", "100000.mem", "000001.vlog", "000002.vlog", "000001.sst", badger.KeyRegistryFileName} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d := newDurableSync(st.sh.db, dir)
	var mu sync.Mutex // the newest files are synced at once
	var newest []string
	d.datasync = func(path string) error {
		mu.Lock()
		defer mu.Unlock()
		newest = append(newest, filepath.Base(path))
		return nil
	}
	if err := d.sync(); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"99999.mem": true, "000001.vlog": true, "100000.mem": false, "000002.vlog": false, "000001.sst": false} {
		if d.synced[name] != want {
			t.Errorf("%s synced=%v, want %v (rotated files are synced once, the newest ones on every sync)", name, d.synced[name], want)
		}
	}
	if ownDescriptors {
		slices.Sort(newest)
		if want := []string{"000002.vlog", "100000.mem"}; !slices.Equal(newest, want) {
			t.Errorf("synced as the newest: %v, want %v", newest, want)
		}
	}
	if !d.synced["seen:100000.mem"] {
		t.Error("a new WAL's directory entry and the key registry were not synced")
	}
	_ = os.Remove(filepath.Join(dir, "99999.mem"))
	if err := d.sync(); err != nil || d.synced["99999.mem"] {
		t.Fatalf("a flushed WAL is still remembered: %v", err)
	}
}

func TestPingWritesNothing(t *testing.T) {
	st := openTemp(t, true)
	before := st.sh.db.MaxVersion()
	for range 3 {
		if err := st.Ping(); err != nil {
			t.Fatal(err)
		}
	}
	if after := st.sh.db.MaxVersion(); after != before {
		t.Fatalf("ping wrote: the database's version went from %d to %d", before, after)
	}
}

// A cancel racing a claim of the same operation leaves the in-memory queue as the store has it:
// the counts and the leases follow the commits, in their order.
func TestCancelRacingAClaimLeavesTheQueueInStep(t *testing.T) {
	st := openTemp(t, false)
	const n = 3000
	for i := range n {
		id := fmt.Sprintf("op_%06d", i)
		op := newOp(id)
		if _, err := st.AcceptOperation(op, &store.Request{}, nil); err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			<-start
			if _, err := st.ClaimNext("w1", time.Minute); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			<-start
			_, _ = st.Transition(id, store.Change{To: store.StatusCanceled})
		})
		close(start)
		wg.Wait()
		if op, err := st.GetOperation(id); err == nil && op.Status == store.StatusRunning {
			if _, err := st.Transition(id, store.Change{To: store.StatusCanceled}); err != nil {
				t.Fatal(err)
			}
		}
		queued, running, _ := st.QueueStats()
		active, _ := st.ActiveCount(op.Scope)
		if queued != 0 || running != 0 || active != 0 {
			t.Fatalf("after %d races: queued %d running %d active %d, want none", i+1, queued, running, active)
		}
	}
}

// A claim committed whose fsync then failed is held all the same (the store is the truth): the
// worker gets the operation, instead of an error while the operation sits running, held by
// it, until its lease runs out and a takeover fails it as WORKER_LOST.
func TestClaimWhoseFsyncFailedIsStillHandedToItsWorker(t *testing.T) {
	st := openTemp(t, true)
	if _, err := st.AcceptOperation(newOp("op_1"), &store.Request{}, nil); err != nil {
		t.Fatal(err)
	}
	syncer := st.sh.syncer
	healthy := syncer.sync
	syncer.sync = func() error { return errors.New("fsync: input/output error") }
	op, err := st.ClaimNext("w1", time.Minute)
	syncer.sync = healthy
	if op == nil {
		if op, err = st.ClaimNext("w1", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if op == nil || op.ID != "op_1" || op.Holder != "w1" || op.Status != store.StatusRunning {
		t.Fatalf("claimed %+v, %v; want op_1 running, held by w1", op, err)
	}
}

// The order keeps the turns of the store.KeepIdleLanes lanes left without work the latest, and
// forgets older ones, unless they have work again; a lane left idle twice counts from its latest.
func TestQueueOrderKeepsTheTurnsOfTheLanesIdleLatest(t *testing.T) {
	o := newQueueOrder()
	working := map[string]int{}
	lane := func(i int) string { return fmt.Sprint("lane-", i) }
	for i := range store.KeepIdleLanes + 100 {
		o.turns[lane(i)] = laneTurn{hold: int64(i)}
		if i == 200 {
			working[lane(1)] = 1 // lane 1 has work again
			o.left(lane(2), working)
		}
		o.left(lane(i), working)
	}
	for i, want := range map[int]bool{0: false, 1: true, 2: true, 3: false, 99: false, 101: true, store.KeepIdleLanes + 99: true} {
		if _, kept := o.turns[lane(i)]; kept != want {
			t.Errorf("lane %d: kept %v, want %v", i, kept, want)
		}
	}
	if n := len(o.turns); n > store.KeepIdleLanes+2 {
		t.Errorf("%d turns kept, want at most %d", n, store.KeepIdleLanes+2)
	}
}

// A lane that leaves again and again takes one place among the lanes kept, and a lane without a
// turn takes none: the turns of store.KeepIdleLanes-1 others are all kept, and the list of
// departures stays bounded.
func TestQueueOrderCountsALaneLeftManyTimesOnce(t *testing.T) {
	o := newQueueOrder()
	idle := map[string]int{}
	for i := range store.KeepIdleLanes - 1 {
		o.turns[fmt.Sprint("lane-", i)] = laneTurn{hold: int64(i)}
		o.left(fmt.Sprint("lane-", i), idle)
	}
	o.turns["chatty"] = laneTurn{hold: 1}
	for range 3 * store.KeepIdleLanes {
		o.left("chatty", idle)
		o.left("never-served", idle)
	}
	if n := len(o.turns); n != store.KeepIdleLanes {
		t.Fatalf("%d turns kept, want %d", n, store.KeepIdleLanes)
	}
	if n := len(o.idle); n > 2*store.KeepIdleLanes {
		t.Fatalf("%d departures listed, want at most %d", n, 2*store.KeepIdleLanes)
	}
}

package badger

import (
	"errors"
	"sync"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/mulligan-gw/mulligan/store"
)

// The Badger backend's queue. One process owns a Badger directory, so what the queue needs to be
// fast (the order of queued ids, which worker holds what, counts per scope) lives in memory
// beside the database, filled from its indexes at open and kept in step after every commit. The
// store stays the truth: the order is rebuilt from the q/ index periodically, so an operation whose
// in-memory enqueue was somehow lost still runs.

// Rebuild cadence of the order: at least this often, and when it runs dry (not more often than
// dryRebuildEvery, since a scan of q/ walks the tombstones of every operation already dequeued).
const (
	rebuildEvery    = 30 * time.Second
	dryRebuildEvery = 5 * time.Second
)

// queueState is the in-memory side of the Badger queue, shared by every handle on one database.
type queueState struct {
	mu        sync.Mutex
	order     *queueOrder        // the queued ids in the capacity order (queueorder.go)
	queued    map[string]waiting // queued id -> what the order needs of it
	running   map[string]*runLease
	active    map[string]int       // scope -> queued + running
	lanes     map[string]int       // lane -> queued + running: a lane left with none is kept idle a while (queueOrder.left)
	workers   map[string]time.Time // worker -> the latest lease it was granted in this process
	rebuiltAt time.Time
}

// runLease is who holds a running operation, and until when.
type runLease struct {
	scope   string
	holder  string
	until   time.Time
	revoked bool // a takeover is being written: the holder must not renew
}

func newQueueState() *queueState {
	return &queueState{
		order: newQueueOrder(), queued: map[string]waiting{}, running: map[string]*runLease{},
		active: map[string]int{}, lanes: map[string]int{}, workers: map[string]time.Time{},
	}
}

// load fills the state from the q/ and u/ indexes at open. Leases of operations found running
// are not live: their worker belonged to a process that is gone.
func (q *queueState) load(db *badger.DB) error {
	return db.View(func(txn *badger.Txn) error {
		for _, st := range []store.Status{store.StatusQueued, store.StatusRunning} {
			prefix := indexPrefix(st)
			it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
			var ids []string
			for it.Rewind(); it.Valid(); it.Next() {
				ids = append(ids, string(it.Item().Key()[len(prefix):]))
			}
			it.Close()
			if err := eachOperation(txn, ids, func(op *store.Operation) { q.moved(op, "") }); err != nil {
				return err
			}
		}
		for _, r := range q.running {
			r.revoked = true // whatever its worker's name, the process that held it is gone
		}
		q.rebuiltAt = time.Now()
		return nil
	})
}

// movedAfterRun is moved, settling run r's turns first when the change ended one (ended), in
// one step: a claim in between would see the lane with neither its run's overrun nor its
// settlement. The caller holds no lock.
func (q *queueState) movedAfterRun(op *store.Operation, prev store.Status, r store.Run, ended bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ended {
		q.order.ran(r)
	}
	q.movedLocked(op, prev)
}

// moved records that a commit left op in its status, coming from prev ("" for a new operation).
// The caller holds no lock.
func (q *queueState) moved(op *store.Operation, prev store.Status) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.movedLocked(op, prev)
}

// movedLocked is moved under q.mu.
func (q *queueState) movedLocked(op *store.Operation, prev store.Status) {
	wasActive := prev == store.StatusQueued || prev == store.StatusRunning
	isActive := op.Status == store.StatusQueued || op.Status == store.StatusRunning
	switch {
	case isActive && !wasActive:
		q.active[op.Scope]++
		q.lanes[op.Lane()]++
	case wasActive && !isActive:
		if q.active[op.Scope]--; q.active[op.Scope] <= 0 {
			delete(q.active, op.Scope)
		}
		if lane := op.Lane(); q.lanes[lane] <= 1 {
			delete(q.lanes, lane)
			q.order.left(lane, q.lanes)
		} else {
			q.lanes[lane]--
		}
	}
	delete(q.queued, op.ID)
	delete(q.running, op.ID)
	delete(q.order.runs, op.ID)
	switch op.Status {
	case store.StatusQueued:
		w := waitingOf(op)
		q.queued[op.ID] = w
		q.order.add(w)
	case store.StatusRunning:
		q.running[op.ID] = &runLease{scope: op.Scope, holder: op.Holder, until: op.LeaseUntil}
		if prev == store.StatusQueued { // a claim's, not one found running at open
			q.order.started(op)
		}
	}
}

// ran settles the turns of a run that ended (queueOrder.ran). The caller holds no lock.
func (q *queueState) ran(r store.Run) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.order.ran(r)
}

// pop takes the first id in the capacity order at now, rebuilding the order from the store when
// it is due or dry. ok is false when nothing queued may be claimed.
func (q *queueState) pop(now time.Time, scan func() ([]string, error), load func([]string) ([]waiting, error)) (claim, bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	since := time.Since(q.rebuiltAt)
	if since >= rebuildEvery || (len(q.order.members) == 0 && since >= dryRebuildEvery) {
		if err := q.rebuild(scan, load); err != nil {
			return claim{}, false, err
		}
	}
	c, ok := q.order.next(q.queued, now)
	return c, ok, nil
}

// rebuild replaces the order with the store's q/ index. It runs under q.mu, so an operation
// committed after the scan's snapshot is added after the rebuild and not lost; one committed
// before it is in the scan (add dedupes).
func (q *queueState) rebuild(scan func() ([]string, error), load func([]string) ([]waiting, error)) error {
	ids, err := scan()
	if err != nil {
		return err
	}
	var lost []string // committed queued, but their in-memory move was lost
	for _, id := range ids {
		if _, ok := q.queued[id]; !ok {
			lost = append(lost, id)
		}
	}
	found, err := load(lost)
	if err != nil {
		return err
	}
	for _, w := range found {
		q.queued[w.id] = w
	}
	q.rebuiltAt = time.Now()
	q.order.groups, q.order.members = map[string][]group{}, make(map[string]struct{}, len(ids))
	for _, id := range ids {
		if w, ok := q.queued[id]; ok {
			q.order.add(w)
		}
	}
	return nil
}

// unpop puts id back in the order after a claim failed to commit.
func (q *queueState) unpop(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w, ok := q.queued[id]; ok {
		q.order.add(w)
	}
}

// live records that worker holds leases until `until` in this process.
func (q *queueState) live(worker string, until time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.liveLocked(worker, until)
}

func (q *queueState) liveLocked(worker string, until time.Time) {
	if worker == "" {
		return
	}
	if until.After(q.workers[worker]) {
		q.workers[worker] = until
	}
}

// expiredLocked reports whether a running operation's lease ran out: past its deadline, revoked,
// or held by a worker that is not live in this process (one process owns a Badger directory, so
// such a worker belonged to a process that is gone).
func (q *queueState) expiredLocked(r *runLease, now time.Time) bool {
	if r == nil || r.revoked || r.holder == "" || !now.Before(r.until) {
		return true
	}
	return !now.Before(q.workers[r.holder])
}

// holds reports whether worker holds running operation id by a lease that has not run out.
func (q *queueState) holds(id, worker string, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	r := q.running[id]
	return r != nil && r.holder == worker && !q.expiredLocked(r, now)
}

// revokeIfExpired checks, for a takeover, that id's lease by holder has run out, and revokes it so
// that a renewal racing the takeover finds it lost.
func (q *queueState) revokeIfExpired(id, holder string, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	r := q.running[id]
	if r != nil && r.holder != holder {
		return false
	}
	if !q.expiredLocked(r, now) {
		return false
	}
	if r != nil {
		r.revoked = true
	}
	return true
}

// ClaimNext moves the next queued operation in the capacity order to running, held by worker
// (see Queue).
func (s *Store) ClaimNext(worker string, lease time.Duration) (*store.Operation, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	q := s.sh.queue
	q.live(worker, s.now().Add(lease))
	for {
		c, ok, err := q.pop(s.now(), func() ([]string, error) { return s.OperationsIn(store.StatusQueued) }, s.loadWaiting)
		if err != nil || !ok {
			return nil, err
		}
		id := c.id
		op, err := s.change(id, c.change(), worker, lease)
		switch {
		case errors.Is(err, store.ErrIllegalTransition) || errors.Is(err, store.ErrNotFound):
			q.ran(c.unclaimed())
			continue // canceled or gone while it waited
		case op != nil:
			// Committed, though perhaps not fsynced: the store holds it for worker, so worker
			// runs it. Were the claim lost with the machine, a restart expires it all the same.
			return op, nil
		case err != nil:
			q.ran(c.unclaimed())
			q.unpop(id)
			return nil, err
		}
		return nil, nil
	}
}

// RenewLeases extends worker's leases on ids (see Queue). On Badger the lease lives in memory:
// one process owns the directory, and after a restart every lease is void anyway.
func (s *Store) RenewLeases(worker string, ids []string, lease time.Duration) (store.Renewal, error) {
	var out store.Renewal
	if err := s.usable(); err != nil {
		return out, err
	}
	now := s.now()
	until := now.Add(lease)
	q := s.sh.queue
	held := make([]string, 0, len(ids))
	q.mu.Lock()
	q.liveLocked(worker, until)
	for _, id := range ids {
		r := q.running[id]
		if r == nil || r.revoked || r.holder != worker {
			out.Lost = append(out.Lost, id)
			continue
		}
		r.until = until
		held = append(held, id)
	}
	q.mu.Unlock()
	err := s.view(func(txn *badger.Txn) error {
		for _, id := range held {
			op, err := getOperation(txn, id)
			if errors.Is(err, store.ErrNotFound) {
				out.Lost = append(out.Lost, id)
				continue
			}
			if err != nil {
				return err
			}
			switch {
			case op.Status != store.StatusRunning || op.Holder != worker:
				out.Lost = append(out.Lost, id)
			case !op.CancelRequestedAt.IsZero():
				out.CancelRequested = append(out.CancelRequested, id)
			}
		}
		return nil
	})
	return out, err
}

// ExpiredLeases returns up to limit running operations whose lease ran out (see Queue).
func (s *Store) ExpiredLeases(limit int) ([]*store.Operation, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	now := s.now()
	q := s.sh.queue
	var ids []string
	q.mu.Lock()
	for id, r := range q.running {
		if len(ids) >= limit {
			break
		}
		if q.expiredLocked(r, now) {
			ids = append(ids, id)
		}
	}
	q.mu.Unlock()
	var out []*store.Operation
	err := s.view(func(txn *badger.Txn) error {
		return eachOperation(txn, ids, func(op *store.Operation) {
			if op.Status == store.StatusRunning {
				out = append(out, op)
			}
		})
	})
	return out, err
}

// eachOperation calls fn with each of operations ids that exists, in order.
func eachOperation(txn *badger.Txn, ids []string, fn func(*store.Operation)) error {
	for _, id := range ids {
		op, err := getOperation(txn, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		fn(op)
	}
	return nil
}

// ActiveCount counts scope's queued and running operations, from memory.
func (s *Store) ActiveCount(scope string) (int, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	q := s.sh.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.active[scope], nil
}

// QueueStats counts queued and running operations, batch lines left out, from memory.
func (s *Store) QueueStats() (queued, running int, err error) {
	if err := s.usable(); err != nil {
		return 0, 0, err
	}
	q := s.sh.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	for id := range q.queued {
		if store.BatchOfLine(id) == "" {
			queued++
		}
	}
	for id := range q.running {
		if store.BatchOfLine(id) == "" {
			running++
		}
	}
	return queued, running, nil
}

// Wakeups is nil on Badger: work is only ever queued by this process, which knows it.
func (s *Store) Wakeups() <-chan struct{} { return nil }

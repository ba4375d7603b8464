package badger

import (
	"errors"
	"runtime"
	"slices"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/mulligan-gw/mulligan/store"
)

// The capacity order on Badger (docs/backends.md, "The capacity order"): queued ids are kept in
// memory by lane (store.Operation.Lane: the fairness key, or the scope) and stored urgency, each
// group oldest first. The next claim is the best of the groups' heads (at most eight a lane), so
// a claim costs in proportion to the lanes with work, not to the operations queued.

// waiting is what the order needs to know of a queued operation.
type waiting struct {
	id, lane string
	urgency  int
	weight   float64
	since    time.Time // submitted: waiting counts from then, also after a requeue
	deadline time.Time
}

func waitingOf(op *store.Operation) waiting {
	return waiting{id: op.ID, lane: op.Lane(), urgency: store.ClampUrgency(op.Urgency), weight: op.Weight,
		since: op.SubmittedAt, deadline: op.QueueDeadline}
}

// stale reports whether w's deadline has passed: it is no longer claimed (StaleQueued).
func (w waiting) stale(now time.Time) bool { return !w.deadline.IsZero() && w.deadline.Before(now) }

// place is where an operation stands in the order: lower effective urgency first, then the lane
// served least recently, then the oldest.
type place struct {
	urgency int
	turn    int64
	id      string
}

func (p place) before(o place) bool {
	if p.urgency != o.urgency {
		return p.urgency < o.urgency
	}
	if p.turn != o.turn {
		return p.turn < o.turn
	}
	return p.id < o.id
}

// queueOrder holds the queued ids in the capacity order, and the lanes' turns.
type queueOrder struct {
	groups  map[string]*[store.LeastUrgent + 1][]string // lane -> urgency -> ids, oldest first; ids no longer queued are dropped when reached
	members map[string]struct{}                         // the ids in groups
	turns   map[string]laneTurn                         // lane -> its turn; absent: not served since it had work
	turn    int64
	// newcomers are the newcomers' turns by band: the lanes absent from turns share them
	// (store.NewcomerTurn).
	newcomers [store.LeastUrgent + 1]int64
	// idle are the lanes with a turn left without work, the longest ago first, each at most once
	// counting (idleAt is where its latest departure is in idle; older entries of it are passed
	// over and dropped), so that store.KeepIdleLanes lanes keep their turns however often one
	// of them goes idle.
	idle   []idleEntry
	idleAt map[string]uint64
	idleN  uint64 // entries ever added
}

// idleEntry is a lane's departure, the n-th added to queueOrder.idle.
type idleEntry struct {
	lane string
	n    uint64
}

// left keeps the turn of lane, just left without work, and forgets that of the lane left so the
// longest ago, beyond store.KeepIdleLanes lanes, unless it has work again (in working: lane ->
// queued + running). A lane without a turn (accepted, then cancelled or expired before any
// claim) takes no place.
func (o *queueOrder) left(lane string, working map[string]int) {
	if _, ok := o.turns[lane]; !ok {
		return
	}
	o.idleN++
	o.idle = append(o.idle, idleEntry{lane, o.idleN})
	o.idleAt[lane] = o.idleN
	for len(o.idleAt) > store.KeepIdleLanes {
		e := o.idle[0]
		o.idle[0] = idleEntry{}
		o.idle = o.idle[1:]
		if o.idleAt[e.lane] != e.n {
			continue // it left again since
		}
		delete(o.idleAt, e.lane)
		if working[e.lane] == 0 {
			delete(o.turns, e.lane)
		}
	}
	if len(o.idle) > 2*store.KeepIdleLanes { // drop the entries passed over, at most once per as many departures
		kept := make([]idleEntry, 0, len(o.idleAt))
		for _, e := range o.idle {
			if o.idleAt[e.lane] == e.n {
				kept = append(kept, e)
			}
		}
		o.idle = kept
	}
}

// laneTurn is a lane's turn (store.ClaimTurn): the turn of the claim that last moved it on, and
// the claims taken since.
type laneTurn struct {
	turn   int64
	credit float64
}

func newQueueOrder() *queueOrder {
	return &queueOrder{groups: map[string]*[store.LeastUrgent + 1][]string{}, members: map[string]struct{}{}, turns: map[string]laneTurn{},
		idleAt: map[string]uint64{}}
}

// turnOf is lane's turn at now, its work w at the head: the turn of a lane not served since it
// had work is when that work came, or the newcomers' turn in w's band when later
// (store.NewcomerTurn).
func (o *queueOrder) turnOf(lane string, w waiting, now time.Time) laneTurn {
	t, served := o.turns[lane]
	if !served {
		return laneTurn{turn: store.NewcomerTurn(w.since, o.newcomers[w.band(now)])}
	}
	t.turn = store.KnownTurn(t.turn, w.since)
	return t
}

// band is the effective urgency w competes at, at now.
func (w waiting) band(now time.Time) int { return store.EffectiveUrgency(w.urgency, now.Sub(w.since)) }

// add puts w in its group in id order (ids sort by creation), so a requeued operation goes before
// those of its group accepted after it.
func (o *queueOrder) add(w waiting) {
	if _, ok := o.members[w.id]; ok {
		return
	}
	o.members[w.id] = struct{}{}
	g := o.groups[w.lane]
	if g == nil {
		g = new([store.LeastUrgent + 1][]string)
		o.groups[w.lane] = g
	}
	i, _ := slices.BinarySearch(g[w.urgency], w.id)
	g[w.urgency] = slices.Insert(g[w.urgency], i, w.id)
}

// head returns the index in group ids of the first operation still queued and not stale,
// dropping from the front the ids no longer queued; -1 when there is none.
func (o *queueOrder) head(ids *[]string, queued map[string]waiting, now time.Time) int {
	for len(*ids) > 0 {
		if _, ok := queued[(*ids)[0]]; ok {
			break
		}
		delete(o.members, (*ids)[0])
		*ids = (*ids)[1:]
	}
	for i, id := range *ids {
		if w, ok := queued[id]; ok && !w.stale(now) {
			return i
		}
	}
	return -1
}

// next takes the first operation in the order out of it and gives its lane its turn; ok is false
// when no queued operation may be claimed.
func (o *queueOrder) next(queued map[string]waiting, now time.Time) (id string, ok bool) {
	lane, u, i, ok := o.best(queued, now)
	if !ok {
		return "", false
	}
	return o.takeAt(lane, u, i, queued, now), true
}

// peek is the id next would take, left in the order.
func (o *queueOrder) peek(queued map[string]waiting, now time.Time) (id string, ok bool) {
	lane, u, i, ok := o.best(queued, now)
	if !ok {
		return "", false
	}
	return o.groups[lane][u][i], true
}

// take takes w out of the order, as next would when w is first, and gives its lane its turn;
// false when w is not in the order.
func (o *queueOrder) take(w waiting, queued map[string]waiting, now time.Time) bool {
	g := o.groups[w.lane]
	if g == nil {
		return false
	}
	i, found := slices.BinarySearch(g[w.urgency], w.id)
	if !found {
		return false
	}
	o.takeAt(w.lane, w.urgency, i, queued, now)
	return true
}

// best finds the first operation in the order: its lane, urgency group and index there.
func (o *queueOrder) best(queued map[string]waiting, now time.Time) (bestLane string, bestU, bestI int, ok bool) {
	var best place
	bestU, bestI = -1, -1
	for lane, g := range o.groups {
		empty := true
		for u := range g {
			i := o.head(&g[u], queued, now)
			empty = empty && len(g[u]) == 0
			if i < 0 {
				continue
			}
			w := queued[g[u][i]]
			p := place{w.band(now), o.turnOf(lane, w, now).turn, w.id}
			if bestI < 0 || p.before(best) {
				best, bestLane, bestU, bestI = p, lane, u, i
			}
		}
		if empty {
			delete(o.groups, lane)
		}
	}
	return bestLane, bestU, bestI, bestI >= 0
}

// takeAt takes the id at i of lane's group u out of the order and gives the lane its turn of a
// claim at now (store.ClaimTurn).
func (o *queueOrder) takeAt(lane string, u, i int, queued map[string]waiting, now time.Time) string {
	g := o.groups[lane]
	id := g[u][i]
	g[u] = slices.Delete(g[u], i, i+1)
	delete(o.members, id)
	w := queued[id]
	t := o.turnOf(lane, w, now)
	turn, credit, advanced := store.ClaimTurn(t.turn, t.credit, w.weight, now, o.turn)
	if _, served := o.turns[lane]; !served {
		band := w.band(now)
		o.newcomers[band] = store.NewcomersServed(o.newcomers[band], now, turn)
	}
	if advanced {
		o.turn = turn
	}
	o.turns[lane] = laneTurn{turn: turn, credit: credit}
	return id
}

// StaleQueued returns up to limit queued operations whose QueueDeadline is before now (see store.Queue).
func (s *Store) StaleQueued(now time.Time, limit int) ([]*store.Operation, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	q := s.sh.queue
	var ids []string
	q.mu.Lock()
	for id, w := range q.queued {
		if len(ids) >= limit {
			break
		}
		if w.stale(now) {
			ids = append(ids, id)
		}
	}
	q.mu.Unlock()
	slices.Sort(ids)
	var out []*store.Operation
	err := s.view(func(txn *badger.Txn) error {
		return eachOperation(txn, ids, func(op *store.Operation) {
			if op.Status == store.StatusQueued {
				out = append(out, op)
			}
		})
	})
	return out, err
}

// QueuePosition estimates how many queued operations will be claimed before id (see store.Queue), from
// memory.
func (s *Store) QueuePosition(id string) (int, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	q := s.sh.queue
	now := s.now()
	q.mu.Lock()
	defer q.mu.Unlock()
	me, ok := q.queued[id]
	if !ok {
		return 0, domainError{store.ErrNotFound}
	}
	level := store.EffectiveUrgency(me.urgency, now.Sub(me.since))
	lanes := map[string]*store.ScopeQueue{}
	for _, w := range q.queued {
		if w.stale(now) {
			continue
		}
		sq := lanes[w.lane]
		if sq == nil {
			_, served := q.order.turns[w.lane]
			sq = &store.ScopeQueue{Scope: w.lane, Turn: q.order.turnOf(w.lane, w, now).turn, Newcomer: !served}
			lanes[w.lane] = sq
		} else {
			sq.Turn = min(sq.Turn, q.order.turnOf(w.lane, w, now).turn) // its oldest work's, whichever comes first here
		}
		countWaiting(sq, w, me, level, now)
	}
	all := make([]store.ScopeQueue, 0, len(lanes))
	for _, sq := range lanes {
		all = append(all, *sq)
	}
	return store.EstimatePosition(me.lane, all), nil
}

// countWaiting adds w to its lane's counts as seen from me, whose effective urgency is level.
func countWaiting(sq *store.ScopeQueue, w, me waiting, level int, now time.Time) {
	switch e := store.EffectiveUrgency(w.urgency, now.Sub(w.since)); {
	case e < level:
		sq.Before++
	case e == level:
		sq.Level++
		if sq.Oldest == "" || w.id < sq.Oldest {
			sq.Oldest = w.id
		}
		if w.lane == me.lane && w.id < me.id {
			sq.Ahead++
		}
	}
}

// QueuedByUrgency counts queued operations by their stored urgency (see store.Queue), from memory.
func (s *Store) QueuedByUrgency() ([8]int, error) {
	var out [8]int
	if err := s.usable(); err != nil {
		return out, err
	}
	q := s.sh.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, w := range q.queued {
		out[w.urgency]++
	}
	return out, nil
}

// loadWaiting reads the queued operations among ids, for a rebuild that found ids the memory did
// not know.
func (s *Store) loadWaiting(ids []string) ([]waiting, error) {
	var out []waiting
	err := s.view(func(txn *badger.Txn) error {
		return eachOperation(txn, ids, func(op *store.Operation) {
			if op.Status == store.StatusQueued {
				out = append(out, waitingOf(op))
			}
		})
	})
	if errors.Is(err, store.ErrNotFound) {
		err = nil
	}
	return out, err
}

// NextQueued returns the operation ClaimNext would claim now, left queued (see store.Queue).
func (s *Store) NextQueued() (*store.Operation, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	q := s.sh.queue
	for range peekTries {
		q.mu.Lock()
		id, ok := q.order.peek(q.queued, s.now())
		q.mu.Unlock()
		if !ok {
			return nil, nil
		}
		op, err := s.GetOperation(id)
		switch {
		case errors.Is(err, store.ErrNotFound) || err == nil && op.Status != store.StatusQueued:
			// Claimed or ended, its commit not yet in memory: the order moves on with it.
			runtime.Gosched()
		case err != nil:
			return nil, err
		default:
			return op, nil
		}
	}
	return nil, nil // the order is moving: the caller looks again
}

// peekTries bounds NextQueued's looks past operations whose change is not yet in memory.
const peekTries = 8

// ClaimQueued moves queued operation id to running, held by worker, as ClaimNext would were it
// next (see store.Queue); nil when it is no longer queued or its deadline passed.
func (s *Store) ClaimQueued(id, worker string, lease time.Duration) (*store.Operation, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	q := s.sh.queue
	q.live(worker, s.now().Add(lease))
	q.mu.Lock()
	w, ok := q.queued[id]
	ok = ok && !w.stale(s.now()) && q.order.take(w, q.queued, s.now())
	q.mu.Unlock()
	if !ok {
		return nil, nil
	}
	op, err := s.change(id, store.Change{To: store.StatusRunning}, worker, lease)
	switch {
	case errors.Is(err, store.ErrIllegalTransition) || errors.Is(err, store.ErrNotFound):
		return nil, nil // canceled or gone meanwhile
	case op != nil:
		return op, nil // committed, though perhaps not fsynced: as ClaimNext
	case err != nil:
		q.unpop(id)
	}
	return nil, err
}

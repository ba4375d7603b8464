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
// memory by lane (store.Operation.Lane: the fairness key, or the scope), stored urgency and own
// urgency (store.OwnUrgency), each group oldest first. The next claim is the best of the lanes,
// each lane's found from its groups' heads (one or two a lane, as a rule), so a claim costs in
// proportion to the lanes with work, not to the operations queued.

// waiting is what the order needs to know of a queued operation.
type waiting struct {
	id, lane string
	urgency  int
	lift     int // store.Operation.Lift
	weight   float64
	since    time.Time // submitted: waiting counts from then, also after a requeue
	deadline time.Time
}

func waitingOf(op *store.Operation) waiting {
	return waiting{id: op.ID, lane: op.Lane(), urgency: store.ClampUrgency(op.Urgency), lift: max(op.Lift, 0), weight: op.Weight,
		since: op.SubmittedAt, deadline: op.QueueDeadline}
}

// stale reports whether w's deadline has passed: it is no longer claimed (StaleQueued).
func (w waiting) stale(now time.Time) bool { return !w.deadline.IsZero() && w.deadline.Before(now) }

// place is where a lane stands in the order: lower effective urgency first, then the lane served
// least recently, then the one whose work there is oldest.
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
	groups  map[string][]group  // lane -> its groups; ids no longer queued are dropped when reached
	members map[string]struct{} // the ids in groups
	turns   map[string]laneTurn // lane -> its turn; absent: not served since it had work
	// vtime is each band's virtual time, the start of its latest claim, and average the slot
	// time the queue's runs took lately (store.LaneStart, store.MovedHold).
	vtime   [store.LeastUrgent + 1]int64
	average int64
	// runs are the claimed operations running, by id, whose time past their charge counts in
	// their turns as they run (store.Overrun).
	runs map[string]runCharge
	// newcomers are the newcomers' turns by band: the lanes absent from turns share them
	// (store.LaneStart, store.NewcomersAfter).
	newcomers [store.LeastUrgent + 1]int64
	// idle are the lanes with a turn left without work, the longest ago first, each at most once
	// counting (idleAt is where its latest departure is in idle; older entries of it are passed
	// over and dropped), so that store.KeepIdleLanes lanes keep their turns however often one
	// of them goes idle.
	idle   []idleEntry
	idleAt map[string]uint64
	idleN  uint64 // entries ever added
}

// group is a lane's queued ids of one stored urgency and one own urgency (before waiting ages
// them), oldest first: its head is its most aged.
type group struct {
	urgency, own int
	ids          []string
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

// laneTurn is a lane's turns in slot time (store.LaneStart): the virtual start of its next claim
// in each band it was claimed in (turns, set; store.TurnIn), and the slot time its runs took
// lately (0: none measured).
type laneTurn struct {
	turns [store.LeastUrgent + 1]int64
	set   uint8 // bit b: turns[b] is set
	hold  int64
}

// in is the lane's turn in band b, and whether it has one there.
func (t laneTurn) in(b int) (int64, bool) { return t.turns[b], t.set&(1<<b) != 0 }

// runCharge is what a running operation's claim charged (store.Operation.Charged).
type runCharge struct {
	lane     string
	weight   float64
	started  time.Time
	charged  int64
	band     int // -1: none
	newcomer bool
	ncCharg  int64 // what its claim charged the newcomers (store.Operation.NewcomersCharged)
}

// overruns are what the runs count in the turns at a moment beyond their claims' charges: per
// lane and band claimed in, over the lane's weight, and per band's newcomers (store.Overrun). A
// run counts in the band it was claimed in only, where its end settles it.
type overruns struct {
	lanes     map[laneBand]int64
	newcomers [store.LeastUrgent + 1]int64
}

// laneBand is a lane in a band.
type laneBand struct {
	lane string
	band int
}

// overrunsAt counts the runs' overruns at now.
func (o *queueOrder) overrunsAt(now time.Time) overruns {
	out := overruns{lanes: map[laneBand]int64{}}
	for _, r := range o.runs {
		if us := store.Overrun(r.started, r.charged, now); us > 0 {
			out.lanes[laneBand{r.lane, r.band}] += int64(float64(us) / store.Weight(r.weight))
		}
		if r.newcomer && r.band >= 0 && r.band < len(out.newcomers) {
			out.newcomers[r.band] += store.Overrun(r.started, r.ncCharg, now)
		}
	}
	return out
}

// started notes a claimed operation's run (op just moved to running by a claim that charged it).
func (o *queueOrder) started(op *store.Operation) {
	if op.Charged > 0 {
		o.runs[op.ID] = runCharge{lane: op.Lane(), weight: op.Weight, started: op.StartedAt, charged: op.Charged,
			band: op.ChargedBand - 1, newcomer: op.ChargedNewcomer, ncCharg: op.NewcomersCharged}
	}
}

func newQueueOrder() *queueOrder {
	return &queueOrder{groups: map[string][]group{}, members: map[string]struct{}{}, turns: map[string]laneTurn{},
		idleAt: map[string]uint64{}, runs: map[string]runCharge{}}
}

// turnOf is lane's turn at now, its work w at the head, its runs' overruns ov: turnIn in w's
// band.
func (o *queueOrder) turnOf(lane string, w waiting, now time.Time, ov overruns) (t laneTurn, start, base int64) {
	return o.turnIn(lane, w.band(now), ov)
}

// turnIn is lane's turn in band, its runs' overruns ov: start, the virtual start of its next
// claim there (store.LaneStart: its turn there, store.TurnIn, or its band's newcomers',
// store.NewcomersTurn, when it has none), and base, the same without the overruns, which a
// claim moves on from and a queue position counts by (in the band of the operation asked
// about, as PostgreSQL's positionSQL reads it).
func (o *queueOrder) turnIn(lane string, band int, ov overruns) (t laneTurn, start, base int64) {
	t, served := o.turns[lane]
	v := o.vtime[band]
	if !served {
		nc := o.newcomers[band]
		return t, store.LaneStart(store.NewcomersTurn(nc, ov.newcomers[band], v, o.average), v),
			store.LaneStart(store.NewcomersTurn(nc, 0, v, o.average), v)
	}
	turn, has := t.in(band)
	own := store.TurnIn(turn, has, v)
	return t, store.LaneStart(own+ov.lanes[laneBand{lane, band}], v), store.LaneStart(own, v)
}

// band is the effective urgency w competes at, at now.
func (w waiting) band(now time.Time) int { return store.EffectiveUrgency(w.urgency, now.Sub(w.since)) }

// own is w's urgency within its own lane at now (store.OwnUrgency), and ownGroup the one its
// group keeps.
func (w waiting) own(now time.Time) int { return store.OwnUrgency(w.urgency, w.lift, now.Sub(w.since)) }
func (w waiting) ownGroup() int         { return store.OwnUrgency(w.urgency, w.lift, 0) }

// claimedBefore reports whether, within one lane and band, w is claimed before v: the lower own
// urgency, then the older.
func (w waiting) claimedBefore(v waiting, now time.Time) bool {
	if a, b := w.own(now), v.own(now); a != b {
		return a < b
	}
	return w.id < v.id
}

// add puts w in its group in id order (ids sort by creation), so a requeued operation goes before
// those of its group accepted after it.
func (o *queueOrder) add(w waiting) {
	if _, ok := o.members[w.id]; ok {
		return
	}
	o.members[w.id] = struct{}{}
	gs := o.groups[w.lane]
	gi := slices.IndexFunc(gs, func(g group) bool { return g.urgency == w.urgency && g.own == w.ownGroup() })
	if gi < 0 {
		gi = len(gs)
		gs = append(gs, group{urgency: w.urgency, own: w.ownGroup()})
		o.groups[w.lane] = gs
	}
	g := &gs[gi]
	i, _ := slices.BinarySearch(g.ids, w.id)
	g.ids = slices.Insert(g.ids, i, w.id)
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

// claim is an operation taken out of the order, and what its claim charged (store.Change).
type claim struct {
	id       string
	lane     string
	weight   float64
	charged  int64
	band     int
	newcomer bool
}

// change is the claim's change of its operation to running. A newcomer's claim always charged
// the newcomers' turn here (one process moves it).
func (c claim) change() store.Change {
	out := store.Change{To: store.StatusRunning, Charged: c.charged, ChargedBand: c.band + 1, ChargedNewcomer: c.newcomer}
	if c.newcomer {
		out.NewcomersCharged = c.charged
	}
	return out
}

// unclaimed is the run of a claim that was never written (its operation canceled meanwhile, or
// its write failed): its end gives back what it charged but the least a claim costs.
func (c claim) unclaimed() store.Run {
	ch := c.change()
	return store.Run{Lane: c.lane, Weight: c.weight, Charged: c.charged, Band: c.band, Newcomer: c.newcomer,
		NewcomersCharged: ch.NewcomersCharged}
}

// next takes the first operation in the order out of it and gives its lane its turn; ok is false
// when no queued operation may be claimed.
func (o *queueOrder) next(queued map[string]waiting, now time.Time) (claim, bool) {
	c, ok := o.best(queued, now)
	if !ok {
		return claim{}, false
	}
	return o.takeAt(c, queued, now), true
}

// peek is the id next would take, left in the order.
func (o *queueOrder) peek(queued map[string]waiting, now time.Time) (id string, ok bool) {
	c, ok := o.best(queued, now)
	if !ok {
		return "", false
	}
	return o.groups[c.lane][c.g].ids[c.i], true
}

// take takes w out of the order, as next would when w is first, and gives its lane its turn;
// false when w is not in the order.
func (o *queueOrder) take(w waiting, queued map[string]waiting, now time.Time) (claim, bool) {
	c, _ := o.laneChoice(w.lane, queued, now) // first: it drops the groups left empty
	gs := o.groups[w.lane]
	gi := slices.IndexFunc(gs, func(g group) bool { return g.urgency == w.urgency && g.own == w.ownGroup() })
	if gi < 0 {
		return claim{}, false
	}
	i, found := slices.BinarySearch(gs[gi].ids, w.id)
	if !found {
		return claim{}, false
	}
	if c.pick.id != w.id { // not the lane's first: its turn counts from its oldest work at w's band
		c = choice{lane: w.lane, pick: w, oldest: o.oldestAt(w.lane, w, queued, now)}
	}
	c.g, c.i = gi, i
	return o.takeAt(c, queued, now), true
}

// choice is a lane's next claim: the operation picked (the group and index of its id) and the
// lane's oldest work at its band, which the lane's turn and place count from.
type choice struct {
	lane         string
	g, i         int
	pick, oldest waiting
}

// laneChoice finds lane's next claim, dropping the groups left empty; ok is false when the lane
// has nothing to claim. Of the lane's work at its most urgent band, it picks the lowest own
// urgency, then the oldest (store.OwnUrgency): a group's head is its oldest, so the heads say
// it.
func (o *queueOrder) laneChoice(lane string, queued map[string]waiting, now time.Time) (c choice, ok bool) {
	gs := o.groups[lane]
	band := store.LeastUrgent + 1
	for gi := 0; gi < len(gs); gi++ {
		i := o.head(&gs[gi].ids, queued, now)
		if len(gs[gi].ids) == 0 {
			gs = slices.Delete(gs, gi, gi+1)
			gi--
			continue
		}
		if i < 0 {
			continue
		}
		w := queued[gs[gi].ids[i]]
		switch b := w.band(now); {
		case b < band:
			band, c = b, choice{lane: lane, g: gi, i: i, pick: w, oldest: w}
		case b == band:
			if w.claimedBefore(c.pick, now) {
				c.g, c.i, c.pick = gi, i, w
			}
			if w.id < c.oldest.id {
				c.oldest = w
			}
		}
	}
	if len(gs) == 0 {
		delete(o.groups, lane)
	} else {
		o.groups[lane] = gs
	}
	return c, band <= store.LeastUrgent
}

// oldestAt is what a claim of w by id counts lane's turn from, w's lane being lane: the oldest of
// the heads of lane's groups that is older than w and at w's band, else w. At the lane's most
// urgent band (where the look before such a claim finds its work) that is the lane's oldest work
// there, as best counts it; below it, a group's newer work already at w's band while its head
// has aged further is not seen.
func (o *queueOrder) oldestAt(lane string, w waiting, queued map[string]waiting, now time.Time) waiting {
	band := w.band(now)
	for gi := range o.groups[lane] {
		g := &o.groups[lane][gi]
		if i := o.head(&g.ids, queued, now); i >= 0 {
			if v := queued[g.ids[i]]; v.id < w.id && v.band(now) == band {
				w = v
			}
		}
	}
	return w
}

// best finds the first operation in the order: the choice of the lane whose place comes first.
func (o *queueOrder) best(queued map[string]waiting, now time.Time) (best choice, ok bool) {
	var at place
	ov := o.overrunsAt(now)
	for lane := range o.groups {
		c, found := o.laneChoice(lane, queued, now)
		if !found {
			continue
		}
		_, start, _ := o.turnOf(lane, c.oldest, now, ov)
		p := place{c.pick.band(now), start, c.oldest.id}
		if !ok || p.before(at) {
			best, at, ok = c, p, true
		}
	}
	return best, ok
}

// takeAt takes c's pick out of the order and gives its lane its turn: moved on from its start by
// the slot time its runs are expected to hold over its weight (store.ClaimCharge,
// store.ChargedTurn), and its band's newcomers' turn with it when the lane had none
// (store.NewcomersAfter). The band's virtual time moves to the claim's start.
func (o *queueOrder) takeAt(c choice, queued map[string]waiting, now time.Time) claim {
	g := &o.groups[c.lane][c.g]
	id := g.ids[c.i]
	g.ids = slices.Delete(g.ids, c.i, c.i+1)
	delete(o.members, id)
	t, start, base := o.turnOf(c.lane, c.oldest, now, o.overrunsAt(now))
	_, served := o.turns[c.lane]
	band := c.pick.band(now)
	hold := t.hold
	if !served {
		hold = 0
	}
	out := claim{id: id, lane: c.lane, weight: c.pick.weight, charged: store.ClaimCharge(hold, o.average), band: band, newcomer: !served}
	if !served {
		o.newcomers[band] = store.NewcomersAfter(o.newcomers[band], base, out.charged)
	}
	o.vtime[band] = max(o.vtime[band], start)
	t.turns[band] = store.ChargedTurn(base, out.charged, c.pick.weight)
	t.set |= 1 << band
	o.turns[c.lane] = t
	return out
}

// ran settles run r's turns: its lane's (when the lane still has one) and its band's newcomers'
// (when its claim charged them) corrected to the time it ran (store.SettledTurn), and the
// lane's and the queue's averages taught it.
func (o *queueOrder) ran(r store.Run) {
	var vtime int64
	if r.InBand() {
		vtime = o.vtime[r.Band]
	}
	if t, ok := o.turns[r.Lane]; ok {
		if turn, has := t.in(max(r.Band, 0)); has && r.InBand() {
			t.turns[r.Band] = store.SettledTurn(turn, r.Delta(), vtime)
		}
		if r.Took > 0 {
			t.hold = store.MovedHold(t.hold, r.Took)
		}
		o.turns[r.Lane] = t
	}
	if r.Newcomer && r.InBand() {
		o.newcomers[r.Band] = store.SettledTurn(o.newcomers[r.Band], r.NewcomersDelta(), vtime)
	}
	if r.Took > 0 {
		o.average = store.MovedHold(o.average, r.Took)
	}
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
			_, _, turn := q.order.turnIn(w.lane, level, overruns{})
			sq = &store.ScopeQueue{Scope: w.lane, Turn: turn, Newcomer: !served}
			lanes[w.lane] = sq
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
		if w.lane == me.lane && w.claimedBefore(me, now) {
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
	var c claim
	if ok && !w.stale(s.now()) {
		c, ok = q.order.take(w, q.queued, s.now())
	} else {
		ok = false
	}
	q.mu.Unlock()
	if !ok {
		return nil, nil
	}
	op, err := s.change(id, c.change(), worker, lease)
	switch {
	case errors.Is(err, store.ErrIllegalTransition) || errors.Is(err, store.ErrNotFound):
		q.ran(c.unclaimed())
		return nil, nil // canceled or gone meanwhile
	case op != nil:
		return op, nil // committed, though perhaps not fsynced: as ClaimNext
	case err != nil:
		q.ran(c.unclaimed())
		q.unpop(id)
	}
	return nil, err
}

package store

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"time"
)

// The capacity order of queued work (docs/backends.md, "The capacity order"), the same on every
// backend.

// AgingStep is how long a queued operation waits to gain one urgency level: a u=7 operation
// reaches the default urgency after 2 minutes, so a steady stream of default work cannot starve
// it (EffectiveUrgency).
const AgingStep = 30 * time.Second

// Urgencies are RFC 9218's: 0 is the most urgent, 7 the least, 3 the default.
const (
	MostUrgent     = 0
	LeastUrgent    = 7
	DefaultUrgency = 3
)

// QueueTimeoutCode is the error code of a queued operation failed because its QueueDeadline
// passed before a seat was free: the one failure allowed straight from queued (CanChange).
const QueueTimeoutCode = "QUEUE_TIMEOUT"

// SharedSeats are seats that several replicas share (capacity's `shared N`): implemented by the
// PostgreSQL backend only, since one Badger directory belongs to one process. Leases are lengths
// of time, begun and ended on the storage's one clock, so replicas whose clocks disagree agree
// on which seats are live; a replica reckons its own hold from before it asked, so it lets a
// seat go no later than the storage does.
type SharedSeats interface {
	// AcquireSeat takes one of limit seats of pool for worker for lease (renewed by RenewSeats,
	// released by ReleaseSeat), for worker's call w; false when all limit seats are held by live
	// holders, or when the free ones are due to better calls of other workers (the fleet's
	// order: more urgent, then waiting longer). It notes w as worker's call in that order until
	// it takes a seat, WithdrawWaiter, or the worker stops looking.
	AcquireSeat(pool, seat, worker string, limit int, lease time.Duration, w SeatWaiter) (bool, error)
	// WithdrawWaiter takes worker's call out of pool's order: it has no call waiting any more.
	WithdrawWaiter(pool, worker string) error
	// ReleaseSeat gives seat back.
	ReleaseSeat(pool, seat string) error
	// RenewSeats extends by lease, from now on the storage's clock, those of seats that worker
	// holds in pool and that are still live, and returns them: a seat not returned lapsed, and
	// another holder may have its place. Only the seats named are renewed, so a seat of worker's
	// that no call holds any more (its release failed, or its taking's answer was lost) lapses
	// like a dead worker's.
	RenewSeats(pool, worker string, seats []string, lease time.Duration) ([]string, error)
	// SeatsHeld counts pool's live seats, held by any replica.
	SeatsHeld(pool string) (int, error)
}

// SeatNotices is what a SharedSeats may do besides: tell a replica at once when a seat of a
// pool may have come free on any replica, so that its waiters look without waiting for their
// next look. A notice is a hint, and may be lost: waiters look on their own too.
type SeatNotices interface {
	// SeatsFreed receives (a buffered channel of one) when a seat of pool may have come free.
	SeatsFreed(pool string) <-chan struct{}
}

// SeatHandover is what a SharedSeats may do besides: give a seat back and take one for the same
// worker's next call in one transaction, so that a seat freed while the worker's own calls wait
// goes on without a second commit, a notice and a look (docs/capacity.md, "Many replicas").
type SeatHandover interface {
	// HandOverSeat releases seat of pool and takes seat next for worker's call w as AcquireSeat
	// does, at once: false when the freed seat is due to a better call of another worker (then it
	// is released, w stands in line, and the replicas are told as ReleaseSeat tells them). On an
	// error nothing is known to have happened: the caller releases seat as it would have, and a
	// next taken whose answer was lost is held by no call and lapses unrenewed.
	HandOverSeat(pool, seat, next, worker string, limit int, lease time.Duration, w SeatWaiter) (bool, error)
}

// SeatWaiter is a call waiting for a shared seat, as the fleet orders it: its urgency (0..7),
// then its turn, then how long it has waited (a length of time, so that replicas' clocks need
// not agree). Without SeatTurns its turn is when it came (Waited ago) or, if later, when the
// replica's turns say it came. Key is its fairness key: a SeatTurns storage ranks the call by
// its key's turn in slot time (the newcomers' for a key without one, never before its band's
// virtual time), reading the turns as it compares the calls in line, and moves them on when the
// call takes a seat; calls at the same turn go in the order they came.
type SeatWaiter struct {
	Urgency int
	Waited  time.Duration
	Key     string
	// Weight is Key's share of the seats against weight-1 keys (SeatTurns); below 1 is 1.
	Weight float64
	// Waiting counts the worker's calls waiting for a seat of the pool by urgency, this one
	// included, as the line keeps them for SeatLine; all zero: not counted.
	Waiting [8]int
}

// SeatLine is what a SharedSeats may do besides: count the calls every worker has waiting for
// a seat of a pool, by urgency, as their places in line last said (a place of a worker that
// does not count counts as one call at its urgency).
type SeatLine interface {
	SeatWaitersByUrgency(pool string) ([8]int, error)
}

// SeatTurns is what a SharedSeats may do besides: keep the keys' turns for shared seats for the
// whole fleet (docs/capacity.md, "Many replicas: `shared N`"), so that a key served on one
// replica waits its turn on every other, and the newcomers (the keys without a turn, under
// SeatNewcomers) share one turn across the fleet, not one per replica. A turn is a time on the
// storage's clock moved by slot time (start-time fair queuing): a call that takes a seat
// (AcquireSeat) moves its key's turn on, from where the call stood in line (the later of the
// turn and its band's virtual time, the start of the latest call taken in the band), by the slot
// time the key's latest seat held or the pool's average if longer, over the pool's seats times
// the key's weight; a seat held longer than that counts in the turn while it is held, and its
// release (ReleaseSeat, HandOverSeat) corrects the turn to the time it held. So a key of long
// calls takes its seats less often than a key of short ones. The turns fall behind the clock
// while several keys wait (the virtual time moves as the seats' time over the keys sharing
// them), so they are compared with each other, never with when a call came. AcquireSeat orders
// the fleet's line by the turns as they
// are when it compares (a turn read by each replica before it stood in line would be stale by
// the next seat taken, and the replicas that had not looked since would rank ahead); turns are
// forgotten KeepIdleLanesFor after they were last written, unless a live seat counts in them.
type SeatTurns interface {
	// SeatTurnsAgo returns how long ago, on the storage's clock, each of keys' turns for seats
	// of pool came, or less than none when it is still to come (a length of time, so that
	// replicas' clocks need not agree); keys without a turn are absent. A key SeatBandTime(u)
	// asks for band u's virtual time.
	SeatTurnsAgo(pool string, keys []string) (map[string]time.Duration, error)
}

// SeatBandTime is the key SeatTurns keeps band u's virtual time under: a call of the band stands
// in line no sooner than it. Never a fairness key nor a scope, as SeatNewcomers.
func SeatBandTime(u int) string { return "*vtime:" + strconv.Itoa(u) }

// SeatNewcomers is the key SeatTurns keeps the newcomers' turn under: never a fairness key
// ("key:...") nor a scope (a hex digest).
const SeatNewcomers = "*newcomers"

// The turns of schema 17 and before, which the durable queue ordered by until turns in slot
// time (LaneStart) replaced them, and which PostgreSQL keeps writing (queue_lanes.turn, credit)
// for a replica of that schema running beside this one during an upgrade (docs/backends.md,
// "Schema"). They are taken by lanes (Lane: an operation's
// fairness key, or its scope without one) and are times in microseconds since the epoch: a claim
// gives its lane TurnAt its time. A lane with a turn counts from the later of it and its oldest
// work's arrival (KnownTurn: going idle banks no turns); a lane without one (new, or forgotten
// after it had no work left for a while) is a newcomer, and counts as served when its oldest
// work came or when the newcomers of its band were last served, if that is later
// (NewcomerTurn). So a lane seen for the first time takes its turn behind the lanes served
// before it came, not ahead of every lane with a backlog, and the newcomers share one turn: a
// new identity per call buys no place in front (start-time fair queuing: a new flow starts at
// the current virtual time). A lane of weight w takes w claims per turn (ClaimTurn).

// TurnAt is the turn of a claim at now, after the latest turn given: now, or just after latest
// when clocks or claims within one microsecond would not move it on.
func TurnAt(now time.Time, latest int64) int64 { return max(now.UnixMicro(), latest+1) }

// Lane is the lane op's work takes turns in: its fairness key, or its scope without one (module
// keys start "key:", scopes are hashes, so the two never meet).
func (op *Operation) Lane() string {
	if op.FairKey != "" {
		return op.FairKey
	}
	return op.Scope
}

// LaneText is k as any storage keeps a text: valid UTF-8 without NUL (a caller's header or query
// bytes may be neither, and PostgreSQL refuses them in a text column). Fairness keys are made so
// (capacity.FairKey), and a backend mends any other the same way rather than refuse a write.
func LaneText(k string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(k, "\x00", ""), "\uFFFD")
}

// MaxWeight bounds a lane's weight, as a class's is bounded.
const MaxWeight = 1000

// ClaimTurn is a lane's turn and credit after a claim at now of its work of weight w: turn and
// credit are the lane's before (turn its arrival turn, credit 0, when it had none), latest the
// latest turn given. A lane takes w claims per turn, counting them in credit (a weight below 1
// counts as 1); the claim that completes them moves the lane's turn on to TurnAt(now, latest),
// and advanced says so. A fraction of a claim carries over: weight 1.5 takes three claims per two
// turns.
func ClaimTurn(turn int64, credit, w float64, now time.Time, latest int64) (_ int64, _ float64, advanced bool) {
	w = min(max(w, 1), MaxWeight)
	if credit++; credit < w {
		return turn, credit, false
	}
	return TurnAt(now, latest), credit - w, true
}

// ArrivalTurn is the turn a scope not yet served counts as having, its oldest work queued at
// since: just before a claim in the same microsecond, which came after it.
func ArrivalTurn(since time.Time) int64 { return since.UnixMicro() - 1 }

// NewcomerTurn is the turn of a lane that has none (new, or forgotten when it had no work
// left), its oldest work queued at since, when newcomers is the newcomers' turn in the band that
// work competes in: just before the latest claim of such a lane in that band (NewcomersServed).
// The lanes without a turn thus take one turn between them in each band, oldest first, as the
// seat pool's newcomers share one lane: a caller minting a credential per operation takes one
// turn against a tenant's backlog, however many credentials it mints, where each counting as
// served when it came went ahead of the backlog every time (docs/backends.md, "The capacity
// order"). One turn per band, so that newcomers claimed in one band (a trusted class's urgent
// calls, each user its own key) do not hold back those of another.
func NewcomerTurn(since time.Time, newcomers int64) int64 {
	return max(ArrivalTurn(since), newcomers)
}

// KnownTurn is the turn of a lane that has one, turn, its oldest work queued at since: the later
// of the two, so that a lane served lately that comes back after it had no work left starts when
// its work came (start-time fair queuing: a flow's start is the later of its last finish and the
// current virtual time), going idle banking no turns, and is no newcomer (NewcomerTurn). A
// backend keeps the turns of lanes left without work for a while (KeepIdleLanes,
// KeepIdleLanesFor) so that a light tenant, whose one operation at a time ends before its next,
// keeps its own turn instead of waiting with the newcomers.
func KnownTurn(turn int64, since time.Time) int64 { return max(turn, ArrivalTurn(since)) }

// KeepIdleLanes is how many lanes left without work Badger keeps the turns of, the latest to be
// left so; KeepIdleLanesFor how long PostgreSQL's sweep keeps such a lane's after it first
// finds the lane so.
const (
	KeepIdleLanes    = 4096
	KeepIdleLanesFor = 10 * time.Minute
)

// NewcomersServed is a band's newcomers' turn after a claim at now, in that band, of a lane that
// had none, turn the lane's turn after it: just before the claim (and before the turn handed
// out, which is later than now when another clock ran ahead), so that the newcomers still
// waiting go before the lane just claimed and after every lane served before it.
func NewcomersServed(newcomers int64, now time.Time, turn int64) int64 {
	return max(newcomers, ArrivalTurn(now), turn-1)
}

// ClampUrgency brings u into 0..7: a stored value out of range waits at the nearest bound.
func ClampUrgency(u int) int { return min(max(u, MostUrgent), LeastUrgent) }

// EffectiveUrgency is the urgency an operation of urgency u competes at after waiting: work
// less urgent than the default gains one level per full AgingStep waited, up to the default and
// no further. So an old low-urgency backlog (a batch's lines) takes turns with default-urgency
// calls instead of going ahead of them, and never overtakes urgent work; work at or above the
// default keeps its urgency. A negative wait (a clock ahead of another's) counts as none.
func EffectiveUrgency(u int, waited time.Duration) int {
	u = ClampUrgency(u)
	return max(min(u, DefaultUrgency), u-int(max(waited, 0)/AgingStep))
}

// OwnUrgency is the urgency an operation of urgency u and lift (Operation.Lift) has within its
// own lane after waiting: the one it asked for, aged as EffectiveUrgency ages it. Within a lane,
// of the work at the lane's most urgent band, the lowest own urgency is claimed first, then the
// oldest; the lane's place against other lanes is its band and turn, its oldest work there
// breaking ties, so asking more urgency for one's own work moves nothing ahead of other lanes
// (docs/backends.md, "The capacity order").
func OwnUrgency(u, lift int, waited time.Duration) int {
	return EffectiveUrgency(ClampUrgency(u)-max(lift, 0), waited)
}

// CanChange reports whether the state machine allows change c of an operation in status from:
// CanTransition, plus queued -> failed for a QUEUE_TIMEOUT (stale work dropped before it ever
// reaches the upstream). A change guarded by c.From needs the operation still in that status.
func CanChange(from Status, c Change) bool {
	if c.From != "" && from != c.From {
		return false
	}
	if CanTransition(from, c.To) {
		return true
	}
	return from == StatusQueued && c.To == StatusFailed && c.Error != nil && c.Error.Code == QueueTimeoutCode
}

// UnmarshalJSON reads an operation, with the urgency of one stored before urgencies existed
// being the default (both backends keep operations as this JSON).
func (op *Operation) UnmarshalJSON(b []byte) error {
	type plain Operation // without this method
	p := plain{Urgency: DefaultUrgency}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*op = Operation(p)
	return nil
}

// ScopeQueue is one scope's queued work as seen from one queued operation, the operation asked
// about (QueuePosition): counts of work whose deadline has not passed, at the effective urgencies
// of the moment.
type ScopeQueue struct {
	Scope string
	// Turn orders the scopes' turns: the scope served least recently (lowest) goes first; a
	// scope without a turn counts as NewcomersTurn gives, one with a turn as TurnIn gives (both
	// through LaneStart, in the band of the operation asked about).
	Turn int64
	// Before counts operations at a more urgent effective urgency than the operation's.
	Before int
	// Level counts operations at the same effective urgency, and Oldest is the oldest of them.
	Level  int
	Oldest string
	// Ahead counts those of Level claimed before the operation within its own lane: of a lower
	// own urgency (OwnUrgency), or as low and older.
	Ahead int
	// Newcomer says the scope has no turn: it waits with the newcomers (NewcomersTurn).
	Newcomer bool
}

// EstimatePosition estimates how many queued operations are claimed before the operation of
// scope own: all those more urgent, those of its own scope ahead of it, and from every other
// scope at its level as many as the turns give them (one per turn, one more if the scope's turn
// comes first). The newcomers (NewcomersTurn) take one turn between them, oldest first: when own
// is one, each newcomer whose work is older goes first, once, and own's lane then takes its turns
// as a known one, a newcomer after it going at each; when own is known, the newcomers count as
// one scope. Waiting changes urgencies meanwhile, and a newcomer once served takes turns of its
// own, so it is an estimate.
func EstimatePosition(own string, scopes []ScopeQueue) int {
	var mine ScopeQueue
	for _, s := range scopes {
		if s.Scope == own {
			mine = s
		}
	}
	first := func(s ScopeQueue) int {
		if s.Turn < mine.Turn || (s.Turn == mine.Turn && s.Oldest < mine.Oldest) {
			return 1
		}
		return 0
	}
	pos, turns := mine.Ahead, mine.Ahead // turns: those each other scope may get before the operation
	var newcomers ScopeQueue             // the other newcomers: as one scope, or those after own
	newcomers.Turn = math.MaxInt64
	for _, s := range scopes {
		pos += s.Before
		if s.Scope == own || s.Level == 0 || !s.Newcomer {
			continue
		}
		if mine.Newcomer && s.Oldest < mine.Oldest {
			pos++ // its first goes before own's first
			turns++
			continue
		}
		newcomers.Level += s.Level
		newcomers.Turn = min(newcomers.Turn, s.Turn)
		if newcomers.Oldest == "" || s.Oldest < newcomers.Oldest {
			newcomers.Oldest = s.Oldest
		}
	}
	for _, s := range scopes {
		if s.Scope != own && s.Level > 0 && !s.Newcomer {
			pos += min(s.Level, turns+first(s))
		}
	}
	if newcomers.Level > 0 {
		if mine.Newcomer {
			pos += min(newcomers.Level, mine.Ahead)
		} else {
			pos += min(newcomers.Level, turns+first(newcomers))
		}
	}
	return pos
}

// Turns in slot time (docs/backends.md, "The capacity order"). Lanes take turns in virtual
// time, as the seat pool's keys do (start-time fair queuing over slot time): a lane's turn is
// the virtual start of its next claim, and a claim moves it on by the slot time the lane's
// operations are expected to hold (ClaimCharge) over its weight; while an operation runs past
// what its claim charged, the excess counts in its lane's turn as it goes (Overrun), and the end
// of its run charges the lane the time it ran (SettledTurn). So a tenant of short operations
// gets as many claims as their slot time earns against a tenant of long ones, not one for each
// of theirs, and a lane whose runs turn long cannot take every slot before the first ends. Each
// band (effective urgency) keeps its own virtual time, the start of its latest claim: a lane
// that starts to wait there (new, or back after it had no work) starts at it, or where its own
// last turn ended when later (LaneStart), so going idle banks no turns and a new lane goes
// behind the lanes with work, not ahead of them. Lanes without a turn take their turns in
// their band's newcomers' turn, which a newcomer's claim moves on as a lane of weight 1, just
// before the lane it claimed (NewcomersAfter), and which its run pays for as a lane's does.
//
// Every value is in microseconds of slot time.

// DefaultHold is the slot time a claim is charged while nothing was measured, and MinCharge the
// least a claim costs (an operation that ends at once, or never reached the upstream, still
// takes a turn).
const (
	DefaultHold = int64(time.Second / time.Microsecond)
	MinCharge   = int64(time.Millisecond / time.Microsecond)
)

// LaneStart is the virtual start of a lane's next claim in a band: its turn there (TurnIn), or
// its band's newcomers' turn (NewcomersTurn) when it has none, and never before the band's
// virtual time vtime.
func LaneStart(turn, vtime int64) int64 { return max(turn, vtime) }

// TurnIn is a lane's turn in a band whose virtual time is vtime: its turn there when it has one
// (has), else vtime, as a lane back from idle there. A lane keeps a turn per band, as each band
// keeps its own virtual time: one turn moved on in whichever band the lane was claimed in,
// read as it stood in another band, made a tenant served for hours at the default urgency wait
// in a band of trusted urgent work until every lane there had caught up with it; and starting a
// lane afresh in each band it moved to gave a tenant that mixes bands a turn on each move.
func TurnIn(turn int64, has bool, vtime int64) int64 {
	if has {
		return turn
	}
	return vtime
}

// NewcomersTurn is a band's newcomers' turn, newcomers, with what their runs count beyond
// their charges (over), at most NewcomersLead(average) ahead of the band's virtual time vtime:
// newcomers that ran long when nobody else had work leave the next new tenant that much to wait
// behind the known lanes, not their whole lead.
func NewcomersTurn(newcomers, over, vtime, average int64) int64 {
	return min(newcomers+over, vtime+NewcomersLead(average))
}

// NewcomersLead is how far the newcomers' turn may lead its band's virtual time: ten claims of
// a lane never measured.
func NewcomersLead(average int64) int64 { return 10 * ClaimCharge(0, average) }

// ClaimCharge is the slot time a claim is charged before its run is measured: its lane's
// operations' moving average (hold), the queue's (average) for a lane never measured, or
// DefaultHold; never less than MinCharge. A lane whose runs were short lately and then sends
// long ones pays its short average at the claim, and the rest as its runs go on (Overrun):
// charging the queue's average as well, as the seat pool does, made a lane of short runs pay
// for the long ones' until each of its runs ended, which under a runner that claims the next
// operation as the last one's seat frees, before its end is written, cost it a claim in five.
func ClaimCharge(hold, average int64) int64 {
	switch {
	case hold > 0:
	case average > 0:
		hold = average
	default:
		hold = DefaultHold
	}
	return max(hold, MinCharge)
}

// Weight is a stored weight as turns count it: 1 to MaxWeight, as a float32, which PostgreSQL
// keeps (so both backends divide by the same number).
func Weight(w float64) float64 { return float64(float32(min(max(w, 1), MaxWeight))) }

// ChargedTurn is a lane's turn after a claim charged charge, base the lane's start without the
// runs still counted (Overrun) and w its weight: base moved on by charge over w, at least a
// microsecond.
func ChargedTurn(base, charge int64, w float64) int64 {
	return base + max(int64(float64(charge)/Weight(w)), 1)
}

// NewcomersAfter is a band's newcomers' turn after a newcomer's claim charged charge, base the
// newcomers' start without the runs still counted: moved on as a lane of weight 1, to just
// before the turn of a weight-1 lane so claimed, so that the newcomers still waiting go before
// it.
func NewcomersAfter(newcomers, base, charge int64) int64 {
	return max(newcomers, base+charge-1)
}

// Overrun is how long an operation that started at started, its claim charged charged, has run
// past that charge at now: what its lane's turn counts of it while it runs (over the lane's
// weight), before its end charges the whole run.
func Overrun(started time.Time, charged int64, now time.Time) int64 {
	if started.IsZero() {
		return 0
	}
	// In whole microseconds of each time, as PostgreSQL keeps them.
	return max(now.Truncate(time.Microsecond).Sub(started.Truncate(time.Microsecond)).Microseconds()-charged, 0)
}

// SettledTurn is a turn corrected by delta, what a run cost beyond what its claim charged over
// the weight (negative: a refund): a refund brings it back no earlier than the band's virtual
// time, and never later than it was.
func SettledTurn(turn, delta, vtime int64) int64 { return max(turn+delta, min(turn, vtime)) }

// MovedHold is a moving average of slot time moved a fifth of the way to took, took counting
// as no more than ten times the average (one very long run does not make every claim after it
// pay as much); took itself when there is no average yet.
func MovedHold(hold, took int64) int64 {
	if hold <= 0 {
		return took
	}
	return hold + (min(took, 10*hold)-hold)/5
}

// Run is what an operation's run tells the turns when it ends (RunOf): its lane and weight, the
// slot time it ran (from its start to the change), what its claim charged, the band it was
// claimed in (-1: none) and whether the claim charged that band's newcomers' turn.
type Run struct {
	Lane             string
	Weight           float64
	Took             int64
	Charged          int64
	Band             int
	Newcomer         bool
	NewcomersCharged int64
}

// RunOf is the run op (still running, before change c at at) ends with c; false when c ends none
// (op not running, or staying so) or a takeover's change (c.LeaseExpired: its worker or process
// is gone), whose run's time until then is how long the lease outlived it (a restart after an
// hour down would charge an hour): that corrects no turn and teaches no average, and its excess
// stops counting as the operation leaves running.
func RunOf(op *Operation, c Change, at time.Time) (Run, bool) {
	if op.Status != StatusRunning || c.To == StatusRunning || c.LeaseExpired {
		return Run{}, false
	}
	var took int64
	if !op.StartedAt.IsZero() {
		took = max(at.Sub(op.StartedAt).Microseconds(), 0)
	}
	return Run{Lane: op.Lane(), Weight: op.Weight, Took: took, Charged: op.Charged, Band: op.ChargedBand - 1,
		Newcomer: op.ChargedNewcomer, NewcomersCharged: op.NewcomersCharged}, true
}

// Delta is what r's run cost its lane's turn beyond what its claim charged, over the lane's
// weight (a refund when negative; zero when its claim charged nothing).
func (r Run) Delta() int64 {
	if r.Charged <= 0 {
		return 0
	}
	return int64(float64(max(r.Took, MinCharge)-r.Charged) / Weight(r.Weight))
}

// NewcomersDelta is the same for its band's newcomers' turn, which counts weight 1, against
// what the claim charged them (the whole run when the claim found their row held): zero when
// its claim was no newcomer's.
func (r Run) NewcomersDelta() int64 {
	if r.Charged <= 0 || !r.Newcomer {
		return 0
	}
	return max(r.Took, MinCharge) - r.NewcomersCharged
}

// InBand reports whether r was claimed in a band (0..LeastUrgent).
func (r Run) InBand() bool { return r.Band >= MostUrgent && r.Band <= LeastUrgent }

package postgres

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
)

// The capacity order on PostgreSQL (docs/backends.md, "The capacity order"), the same as Badger's:
// effective urgency, then the lanes' turns in slot time (queue_lanes; store.LaneStart), then oldest first. A
// lane is an operation's fairness key, or its scope (laneSQL). Within a lane, the caller's own
// urgency, then the oldest (store.OwnUrgency).

// laneSQL is store.Operation.Lane of a row of operations (alias o): its lane column is NULL
// without a fairness key, and in rows of binaries before schema 11.
const laneSQL = `coalesce(o.lane, o.scope)`

// effectiveSQL is store.EffectiveUrgency in SQL for a row of operations (alias o) at $1, with
// store.AgingStep in seconds as $2: the clamped urgency (0..7) less the steps waited, but no
// lower than itself or store.DefaultUrgency (3), whichever is lower. Both are exact: extract(epoch
// ...) is numeric.
const effectiveSQL = `greatest(least(greatest(o.urgency, 0), 7, 3), least(greatest(o.urgency, 0), 7)
	- floor(greatest(extract(epoch FROM $1::timestamptz - coalesce(o.submitted_at, $1::timestamptz)), 0) / $2::numeric))`

// claimable is the condition on a queued row that may be claimed at $1: its deadline has not passed.
const claimable = `o.status = 'queued' AND (o.queue_deadline IS NULL OR o.queue_deadline >= $1)`

// ownSQL is store.OwnUrgency in SQL for a row of operations (alias o) at $1, $2 the aging step:
// effectiveSQL of the urgency less the lift.
var ownSQL = strings.ReplaceAll(effectiveSQL, "o.urgency", "(least(greatest(o.urgency, 0), 7) - greatest(o.lift, 0))")

// headsSQL walks the head of each (lane, urgency, lift) group of the queued index whose rows
// match cond besides being claimable at $1 (a loose index scan: a row per group with work, not
// the whole queue), a group's head being its oldest. Its rows are lane, urgency, lift, id,
// submitted_at.
func headsSQL(cond string) string {
	sel := `SELECT ` + laneSQL + ` AS lane, o.urgency, o.lift, o.id, o.submitted_at FROM operations o WHERE ` + claimable + cond
	order := ` ORDER BY ` + laneSQL + `, o.urgency, o.lift, o.id LIMIT 1`
	return `heads AS ((` + sel + order + `)
	UNION ALL
	SELECT n.* FROM heads h CROSS JOIN LATERAL (` + sel + ` AND (` + laneSQL + `, o.urgency, o.lift) > (h.lane, h.urgency, h.lift)` + order + `) n)`
}

// nextInOrderSQL finds the first operation in the capacity order at $1, leaving out the ids $3
// (rows another claimer holds): it walks the groups' heads (headsSQL), finds each lane's band
// (e) and its oldest work there, which give the lane's place: its turn in slot time with its
// runs' overruns (slotStartSQL), its oldest work breaking a tie; and of the first lane's work at
// its band picks the lowest own urgency (store.OwnUrgency), then the oldest. Its row: the id
// picked, the lane, the lane's turn of schema 17 (store.KnownTurn, or store.NewcomerTurn with its
// band's newcomers' row when the lane has none), its band, its start and base (slotStartSQL),
// the claim's charge (chargeSQL), whether the lane is a newcomer, and its band's virtual time.
var nextInOrderSQL = `WITH RECURSIVE ` + headsSQL(` AND o.id <> ALL($3)`) + `,
banded AS (SELECT h.*, (` + effectiveHeadSQL + `)::int AS e, (` + ownHeadSQL + `)::int AS own FROM heads h),
lanes AS (SELECT DISTINCT ON (lane) lane, e, id AS oldest, submitted_at FROM banded ORDER BY lane, e, id),
picks AS (SELECT DISTINCT ON (lane) lane, id FROM banded ORDER BY lane, e, own, id),
` + runsSQL("$1") + `
SELECT p.id, o.lane, CASE WHEN t.turn IS NULL THEN greatest(` + arrivalTurnSQL + `, nc.turn)
	ELSE greatest(t.turn, ` + arrivalTurnSQL + `) END AS turn, o.e,
	` + slotStartSQL("o.e", "coalesce(lo.over, 0)", "coalesce(no.over, 0)") + ` AS start, ` + slotStartSQL("o.e", "0", "0") + ` AS base,
	` + chargeSQL + ` AS charge, t.vturns IS NULL AS fresh, ` + vtimeSQL + ` AS vt, coalesce(nd.vturn, 0) AS dn
FROM lanes o JOIN picks p ON p.lane = o.lane ` + turnJoinsSQL("o.lane", "o.e") + `
	LEFT JOIN lane_over lo ON lo.lane = o.lane AND lo.band = o.e LEFT JOIN nc_over no ON no.band = o.e
ORDER BY o.e, 5, o.oldest LIMIT 1`

// The rows of queue_lanes that keep, besides the newcomers' turns of schema 17 and before
// (newcomersLane || band, whose vturn is the newcomers' turn in slot time as claims move it): the
// corrections the newcomers' runs made to it (debtLane || band: their vturn, which only the ends
// of runs write, so that an end never waits for a claim holding the newcomers' row, nor skips
// it), each band's virtual time (vtimeLane || band), and the queue's average run (averageLane:
// its hold). All are among the newcomers' rows, which every sweep keeps.
const (
	debtLane    = newcomersLane + "debt:"
	vtimeLane   = newcomersLane + "vtime:"
	averageLane = newcomersLane + "average"
)

// turnJoinsSQL joins a lane's row (t), its band's rows (nc, nd, v) and the average's (a) to a
// query, for the lane and band expressions given.
func turnJoinsSQL(lane, band string) string {
	return `LEFT JOIN queue_lanes t ON t.lane = ` + lane + `
	LEFT JOIN queue_lanes nc ON nc.lane = ` + newcomersLaneSQL(band) + `
	LEFT JOIN queue_lanes nd ON nd.lane = ('` + debtLane + `' || ` + band + `)
	LEFT JOIN queue_lanes v ON v.lane = ('` + vtimeLane + `' || ` + band + `)
	LEFT JOIN queue_lanes a ON a.lane = '` + averageLane + `'`
}

// vtimeSQL is the band's virtual time (turnJoinsSQL's v), and newcomersTurnSQL its newcomers'
// turn in slot time: the claims' part and the runs' corrections.
const (
	vtimeSQL         = `coalesce(v.vturn, 0)`
	newcomersTurnSQL = `(coalesce(nc.vturn, 0) + coalesce(nd.vturn, 0))`
)

// slotStartSQL is store.LaneStart in the band expression given of a lane's row t (none: NULL
// columns) and the rows turnJoinsSQL joins: its turn there (store.TurnIn) with its runs'
// overruns over, or, for a lane without vturns, its band's newcomers' turn with theirs, ncOver
// (store.NewcomersTurn).
func slotStartSQL(band, over, ncOver string) string {
	return `CASE WHEN t.vturns IS NULL THEN greatest(least(` + newcomersTurnSQL + ` + ` + ncOver + `, ` + vtimeSQL + ` + ` + newcomersLeadSQL + `), ` + vtimeSQL + `)
	ELSE greatest(` + turnInSQL("t", band) + ` + ` + over + `, ` + vtimeSQL + `) END`
}

// turnInSQL is store.TurnIn of a lane's row x in the band expression given: its vturns there
// (vturns[band + 1]), or the band's virtual time.
func turnInSQL(x, band string) string {
	return `coalesce(` + x + `.vturns[` + band + ` + 1], ` + vtimeSQL + `)`
}

// newcomersLeadSQL is store.NewcomersLead of the average's row a.
var newcomersLeadSQL = `10 * greatest(CASE WHEN a.hold > 0 THEN a.hold ELSE ` + strconv.FormatInt(store.DefaultHold, 10) + ` END, ` +
	strconv.FormatInt(store.MinCharge, 10) + `)`

// chargeSQL is store.ClaimCharge of a lane's row t and the average's row a: the lane's hold when
// it has a turn in slot time and a run measured, else the queue's average.
var chargeSQL = `greatest(CASE WHEN t.vturns IS NOT NULL AND t.hold > 0 THEN t.hold WHEN a.hold > 0 THEN a.hold
	ELSE ` + strconv.FormatInt(store.DefaultHold, 10) + ` END, ` + strconv.FormatInt(store.MinCharge, 10) + `)::bigint`

// weightSQL is store.Weight of a weight column w.
func weightSQL(w string) string {
	return `least(greatest(coalesce(` + w + `, 1), 1), ` + strconv.Itoa(store.MaxWeight) + `)::real::float8`
}

// runsSQL are the CTEs of the claimed operations running at now, with what counts of them in
// their turns beyond their claims' charges (store.Overrun: us for their lanes, ncus for their
// band's newcomers), from the run's columns their claim wrote (runColumnsSet), and their sums:
// per lane and band claimed in, each over its weight (lane_over: a run counts in the band where
// its end settles it), and per band for the newcomers (nc_over). A
// release before schema 18 writes none, and its runs count nothing; a run's columns left by an
// earlier claim of this release count only while the same worker holds the operation.
func runsSQL(now string) string {
	elapsed := `floor(extract(epoch FROM ` + now + `::timestamptz - o.run_started_at) * 1000000)`
	return `runs AS (SELECT ` + laneSQL + ` AS lane, ` + weightSQL("o.weight") + ` AS w, o.run_band AS band, o.run_newcomer AS newcomer,
		greatest(` + elapsed + ` - o.run_charged, 0) AS us, greatest(` + elapsed + ` - coalesce(o.run_nc_charged, 0), 0) AS ncus
	FROM operations o WHERE o.status = 'running' AND o.run_charged > 0 AND o.holder = o.run_holder),
lane_over AS (SELECT lane, band, sum(floor(us / w))::bigint AS over FROM runs GROUP BY lane, band),
nc_over AS (SELECT band, sum(ncus)::bigint AS over FROM runs WHERE newcomer GROUP BY band)`
}

// runColumnsSet completes putOpRun's update of a claimed operation's row with what its claim
// charged, for runsSQL: the holder, when it started, the charge, the band it was claimed in,
// whether it was a newcomer's and what it charged the band's newcomers ($16-$21).
const runColumnsSet = `, run_holder = $16, run_started_at = $17, run_charged = $18, run_band = $19,
	run_newcomer = $20, run_nc_charged = $21`

// laneArrivalSQL is the arrival turn (arrivalTurnSQL) a claim by id (ClaimQueued) of a row x of
// operations counts its lane's turn from, at $1 with the aging step $2, as Badger's
// queueOrder.oldestAt: the oldest of the heads of x's lane's groups that is older than x and at
// x's band, else x's own. At the lane's most urgent band, where the look before a claim finds its
// work, that is the lane's oldest work there, as nextInOrderSQL counts it.
var laneArrivalSQL = `coalesce((WITH RECURSIVE ` + headsSQL(` AND `+laneSQL+` = coalesce(x.lane, x.scope)`) + `
	SELECT ` + strings.ReplaceAll(arrivalTurnSQL, "o.", "h.") + ` FROM heads h
	WHERE h.id < x.id AND (` + effectiveHeadSQL + `) = (` + strings.ReplaceAll(effectiveSQL, "o.", "x.") + `) ORDER BY h.id LIMIT 1),
	` + strings.ReplaceAll(arrivalTurnSQL, "o.", "x.") + `)`

// effectiveHeadSQL and ownHeadSQL are effectiveSQL and ownSQL for a row of heads (alias h).
var (
	effectiveHeadSQL = strings.ReplaceAll(effectiveSQL, "o.", "h.")
	ownHeadSQL       = strings.ReplaceAll(ownSQL, "o.", "h.")
)

// newcomersLane prefixes the rows of queue_lanes that keep the newcomers' turns, one per band
// (store.NewcomersTurn; schema 17's store.NewcomerTurn): lanes are fairness keys ("key:...") or scopes (hex digests), so none is
// ever an operation's. The rows are made at open and by the sweep (ensureNewcomers), never by a
// claim: a claim that inserted one would wait for every claim holding it.
const newcomersLane = "*newcomers:"

// newcomersLaneSQL is the newcomers' row of the band of expression e (an integer 0..7).
func newcomersLaneSQL(e string) string { return `('` + newcomersLane + `' || ` + e + `)` }

// newcomersSQL are the CTEs that move the newcomers' turns on for a claim at $now (microseconds)
// of a row of src (columns lane, e: its band, start, base, charge, dn: the band's newcomers'
// corrections, and fresh: whether the lane had no turn in slot time). The turn of schema 17 and
// before (store.NewcomersServed) moves when the lane had no row before the statement, to just
// before the claim or the turn handed out (CTE turn, column t); the turn in slot time
// (store.NewcomersAfter, less the corrections kept apart) when the lane had no vturn. The band's
// virtual time moves to the claim's start. A row is updated unless another claim holds it (SKIP
// LOCKED: that claim moves it on to about the same), so the claims on every replica never wait
// for one another there; nc_moved returns the band when it moved the newcomers' turn.
func newcomersSQL(src string, now int) string {
	return `nc_new AS (SELECT s.e, s.base, s.charge, s.dn, NOT EXISTS (SELECT 1 FROM queue_lanes t WHERE t.lane = s.lane) AS absent
	FROM ` + src + ` s WHERE s.fresh),
nc_moved AS (UPDATE queue_lanes q SET turn = CASE WHEN n.absent THEN greatest(q.turn, $` + strconv.Itoa(now) + `::bigint - 1, (SELECT max(t) FROM turn) - 1)
		ELSE q.turn END,
	vturn = greatest(coalesce(q.vturn, 0), n.base + n.charge - 1 - n.dn)
	FROM nc_new n WHERE q.lane = ` + newcomersLaneSQL("n.e") + ` AND q.lane IN (SELECT l.lane FROM queue_lanes l
		WHERE l.lane IN (SELECT ` + newcomersLaneSQL("m.e") + ` FROM nc_new m) FOR UPDATE SKIP LOCKED) RETURNING n.e),
v_moved AS (UPDATE queue_lanes q SET vturn = greatest(coalesce(q.vturn, 0), s.start) FROM ` + src + ` s
	WHERE q.lane = ('` + vtimeLane + `' || s.e) AND q.lane IN (SELECT l.lane FROM queue_lanes l
		WHERE l.lane IN (SELECT '` + vtimeLane + `' || m.e FROM ` + src + ` m) FOR UPDATE SKIP LOCKED))`
}

// ensureNewcomers makes the newcomers' rows that are missing: at open, and at each sweep, since
// an older release's sweep takes them for lanes without work and deletes them. Only those missing
// from its snapshot are inserted: inserting one that exists would wait for any claim moving it.
func ensureNewcomers(ctx context.Context, db querier) error {
	// A band's virtual time made again (an early schema 12 build's sweep deleted the rows of
	// lanes without work) starts at the latest of the others kept, not at zero, where every lane
	// with a turn would be far ahead of it, and the newcomers first: a guess (the bands' virtual
	// times are not one clock), which the band's next claims correct.
	_, err := db.Exec(ctx, `INSERT INTO queue_lanes (lane, turn, vturn) SELECT l, 0, CASE WHEN l LIKE '`+vtimeLane+`%'
			THEN (SELECT max(vturn) FROM queue_lanes WHERE lane LIKE '`+vtimeLane+`%') END
		FROM (SELECT `+newcomersLaneSQL("u")+` AS l
		FROM generate_series(`+strconv.Itoa(store.MostUrgent)+`, `+strconv.Itoa(store.LeastUrgent)+`) u
		UNION ALL SELECT '`+debtLane+`' || u FROM generate_series(`+strconv.Itoa(store.MostUrgent)+`, `+strconv.Itoa(store.LeastUrgent)+`) u
		UNION ALL SELECT '`+vtimeLane+`' || u FROM generate_series(`+strconv.Itoa(store.MostUrgent)+`, `+strconv.Itoa(store.LeastUrgent)+`) u
		UNION ALL SELECT '`+averageLane+`') n
		WHERE NOT EXISTS (SELECT 1 FROM queue_lanes q WHERE q.lane = n.l) ON CONFLICT (lane) DO NOTHING`)
	return err
}

// arrivalTurnSQL is store.ArrivalTurn of a row o: the turn of a lane without one, in
// microseconds since the epoch, as claims give them (takeTurnSQL).
const arrivalTurnSQL = `(floor(extract(epoch FROM o.submitted_at) * 1000000)::bigint - 1)`

// laneTurnSQL is store.ClaimTurn in SQL: it gives the lane of each row of src (columns lane,
// arrival: its turn should it have none, and weight: the claimed work's) the turn of a claim at
// $now, in microseconds. A claim that completes the lane's weight moves its turn on to the
// claim's time, or just after the latest turn given when that is later; the sequence keeps the
// latest (setval is not transactional, so two claims at once may share a turn: their ids then
// decide). The sequence moves once per claim: a lane of weight 1 with a row takes the turn the
// insert drew (excluded.turn); drawing again put its turn a microsecond after Badger's. A lane's
// row is counted on from its locked latest version (ON CONFLICT DO UPDATE), so claims of one
// lane on two replicas at once each count. It returns the lane's turn after the claim (t), and
// clears the sweep's note that the lane was idle. It also gives the lane its turn in slot time
// (store.ChargedTurn): src's base moved on by its charge over the weight (inc), counted from the
// locked latest vturns (and the band's virtual time vt) when the lane has one, so that a claim or
// a run's end on another replica since src's snapshot counts.
func laneTurnSQL(src string, now int) string {
	next := `setval('queue_turn_seq', greatest(nextval('queue_turn_seq'), $` + strconv.Itoa(now) + `::bigint))`
	return `INSERT INTO queue_lanes AS q (lane, turn, credit, weight, vturns)
	SELECT s.lane, CASE WHEN 1 < s.w THEN s.arrival ELSE ` + next + ` END, CASE WHEN 1 < s.w THEN 1 ELSE 1 - s.w END, s.w,
		(SELECT array_agg(CASE WHEN i = s.e THEN s.base + s.inc END ORDER BY i) FROM generate_series(0, ` + strconv.Itoa(store.LeastUrgent) + `) i)
	FROM (SELECT lane, arrival, base, inc, e, least(greatest(coalesce(weight, 1), 1), ` + strconv.Itoa(store.MaxWeight) + `)::real AS w
		FROM ` + src + `) s
	ON CONFLICT (lane) DO UPDATE SET
		turn = CASE WHEN q.credit + 1 < excluded.weight THEN greatest(q.turn, excluded.turn)
			WHEN 1 < excluded.weight THEN ` + next + ` ELSE excluded.turn END,
		credit = CASE WHEN q.credit + 1 < excluded.weight THEN q.credit + 1 ELSE q.credit + 1 - excluded.weight END,
		vturns = CASE WHEN q.vturns IS NULL THEN excluded.vturns
			ELSE (SELECT array_agg(CASE WHEN i = x.e THEN greatest(coalesce(q.vturns[i + 1], x.vt), x.vt) + x.inc ELSE q.vturns[i + 1] END
				ORDER BY i) FROM generate_series(0, ` + strconv.Itoa(store.LeastUrgent) + `) i, (SELECT * FROM ` + src + ` LIMIT 1) x) END,
		weight = excluded.weight, idle_since = NULL
	RETURNING q.turn AS t`
}

// takeTurnSQL gives the lane of operation $1 the turn of a claim at $3 (microseconds; $5 the
// same time), $2 its arrival turn (laneArrivalSQL) should it have none (laneTurnSQL; the
// newcomers' turn of its band $4 when later, which the claim then moves on: newcomersSQL), and
// its turn in slot time as a claim by ClaimNext would (slotStartSQL, chargeSQL). The lane and
// weight are the row's: an operation accepted by a schema 10 replica has no lane column, and
// waits in its scope's lane. Its row: the charge, and whether it moved the newcomers' turn.
var takeTurnSQL = `WITH ` + runsSQL("$5") + `,
one AS (SELECT ` + laneSQL + ` AS lane, CASE WHEN t.turn IS NULL THEN greatest($2::bigint, nc.turn)
		ELSE greatest(t.turn, $2::bigint) END AS arrival, o.weight, $4::int AS e,
		` + slotStartSQL("$4::int", "coalesce(lo.over, 0)", "coalesce(no.over, 0)") + ` AS start, ` + slotStartSQL("$4::int", "0", "0") + ` AS base,
		` + chargeSQL + ` AS charge, t.vturns IS NULL AS fresh, ` + vtimeSQL + ` AS vt, coalesce(nd.vturn, 0) AS dn
	FROM operations o ` + turnJoinsSQL(laneSQL, "$4::int") + `
		LEFT JOIN lane_over lo ON lo.lane = ` + laneSQL + ` AND lo.band = $4::int LEFT JOIN nc_over no ON no.band = $4::int WHERE o.id = $1),
claimed AS (SELECT *, greatest(floor(charge / ` + weightSQL("weight") + `)::bigint, 1) AS inc FROM one),
turn AS (` + laneTurnSQL("claimed", 3) + `),
` + newcomersSQL("claimed", 3) + `
SELECT charge, fresh, CASE WHEN EXISTS (SELECT 1 FROM nc_moved) THEN charge ELSE 0 END FROM claimed`

// settleRunSQL and settleNewcomersSQL settle the turns of a run that ended (store.Run, as
// Badger's queueOrder.ran), in this order, so that the ends of runs lock rows in one order.
// settleRunSQL: the lane's turn in slot time ($1), when it has one, corrected by what the run
// cost beyond its claim's charge ($2; store.SettledTurn, no earlier than the virtual time of the
// band it was charged in), and its average taught the time it ran ($3 microseconds; none when
// 0). settleNewcomersSQL: the newcomers' corrections of the band it was claimed in ($2, the row
// of corrections; $1 the newcomers' row; $3 the correction, none when 0; $4 the band's virtual
// time's row), then the queue's average ($5, taught $6, the time it ran; none when 0), passed
// over when another run's end holds it (SKIP LOCKED). A claim never locks a row of corrections
// nor the average, so an end waits for no claim but on its own lane's row, and two ends lock
// the rows they share in the same order. The rows of corrections are one per band for the
// whole fleet: the newcomers' runs' ends in one band commit one after another.
var (
	settleRunSQL = `UPDATE queue_lanes q SET vturns = CASE WHEN q.vturns[$4::int + 1] IS NULL THEN q.vturns
			ELSE (SELECT array_agg(CASE WHEN i = $4::int THEN greatest(q.vturns[i + 1] + $2::bigint,
				least(q.vturns[i + 1], coalesce((SELECT v.vturn FROM queue_lanes v WHERE v.lane = ('` + vtimeLane + `' || $4::int)), 0)))
				ELSE q.vturns[i + 1] END ORDER BY i) FROM generate_series(0, ` + strconv.Itoa(store.LeastUrgent) + `) i) END,
		hold = CASE WHEN $3::bigint > 0 THEN ` + movedHoldSQL("q.hold", "$3") + ` ELSE q.hold END
	WHERE q.lane = $1 AND q.vturns IS NOT NULL`
	settleNewcomersSQL = `WITH debt AS (UPDATE queue_lanes q SET vturn = coalesce(q.vturn, 0) + greatest($3::bigint,
			least(0, coalesce((SELECT v.vturn FROM queue_lanes v WHERE v.lane = $4), 0)
				- coalesce((SELECT n.vturn FROM queue_lanes n WHERE n.lane = $1), 0) - coalesce(q.vturn, 0)))
		WHERE q.lane = $2 AND $3::bigint <> 0),
	average AS (UPDATE queue_lanes q SET hold = ` + movedHoldSQL("q.hold", "$6") + `
		WHERE $6::bigint > 0 AND q.lane IN (SELECT l.lane FROM queue_lanes l WHERE l.lane = $5 FOR UPDATE SKIP LOCKED))
	SELECT 1`
)

// movedHoldSQL is store.MovedHold of the average h and the run's time took.
func movedHoldSQL(h, took string) string {
	return `CASE WHEN coalesce(` + h + `, 0) <= 0 THEN ` + took + `::bigint ELSE ` + h + ` + (least(` + took + `::bigint, 10 * ` + h + `) - ` + h + `) / 5 END`
}

// settleRun settles run r's turns (settleRunSQL, settleNewcomersSQL) through w, in that order.
// A statement that would change nothing (a run its claim charged nothing, that never started)
// is not sent.
func settleRun(ctx context.Context, w execer, r store.Run) error {
	var nd int64
	if r.Newcomer && r.InBand() {
		nd = r.NewcomersDelta()
	}
	if r.Delta() == 0 && nd == 0 && r.Took <= 0 {
		return nil
	}
	band := ""
	if r.InBand() {
		band = strconv.Itoa(r.Band)
	}
	if _, err := w.Exec(ctx, settleRunSQL, store.LaneText(r.Lane), r.Delta(), r.Took, r.Band); err != nil {
		return err
	}
	_, err := w.Exec(ctx, settleNewcomersSQL, newcomersLane+band, debtLane+band, nd, vtimeLane+band, averageLane, r.Took)
	return err
}

// claimTries bounds how many rows one claim passes over because other claimers hold them: more
// than the workers claiming at once on every replica, or a claim would answer "none" with work
// queued (its worker would then wait for the next wake-up).
const claimTries = 128

// forgottenSeatTurn is the condition of a row of seat_turns the sweep forgets ($1: how long
// after, in microseconds): neither written since (a take moves its turn to the clock, a release
// its seen) nor counting a live seat's time (a key's seats, or the newcomers' for the seats taken
// in their turn), which a call held longer than that would lose.
const forgottenSeatTurn = `greatest(seen, turn) < clock_timestamp() - $1 * interval '1 microsecond'
	AND NOT EXISTS (SELECT 1 FROM seats s WHERE s.pool = seat_turns.pool AND s.` + seatLive + `
		AND (s.key = seat_turns.key OR seat_turns.key = '` + store.SeatNewcomers + `' AND s.newcomer))`

// seatTurnBatches bounds the batches of the fleet's turns for shared seats one sweep forgets.
const seatTurnBatches = 20

// agingStep is store.AgingStep in seconds, as effectiveSQL takes it.
var agingStep = store.AgingStep.Seconds()

// claimSQL finds the first operation in the capacity order (nextInOrderSQL), locks it if it is
// still queued and no other claimer holds it (FOR UPDATE SKIP LOCKED: the row's latest version
// is checked again, so one claimed since the statement's snapshot is passed over), and gives
// its lane its turn of a claim at $4 (laneTurnSQL), in one statement: the candidate's id, and
// its columns when locked. The turn is always written: a lane's turn is the time of its latest
// claim that completed its weight, so one left at an older claim would go ahead of a lane that
// came since.
var claimSQL = `WITH next AS (` + nextInOrderSQL + `),
claimed AS (SELECT o.doc, o.holder, o.lease_until, n.lane, n.turn AS arrival, o.weight, n.e, n.start, n.base, n.charge, n.fresh,
		n.vt, n.dn, greatest(floor(n.charge / ` + weightSQL("o.weight") + `)::bigint, 1) AS inc
	FROM operations o JOIN next n ON o.id = n.id WHERE o.status = 'queued' FOR UPDATE OF o SKIP LOCKED),
turn AS (` + laneTurnSQL("claimed", 4) + `),
` + newcomersSQL("claimed", 4) + `
SELECT n.id, c.doc, c.holder, c.lease_until, n.charge, n.e, n.fresh, CASE WHEN EXISTS (SELECT 1 FROM nc_moved) THEN n.charge ELSE 0 END
FROM next n LEFT JOIN claimed c ON true`

// claimInOrder locks the first queued operation in the capacity order that no other claimer
// holds and gives its lane its turn (claimSQL); nil when there is none.
func claimInOrder(ctx context.Context, tx pgx.Tx, now time.Time) (*store.Operation, claimCharge, error) {
	skipped := []string{}
	for range claimTries {
		var id string
		var doc []byte
		var holder *string
		var lease *time.Time
		var c claimCharge
		err := tx.QueryRow(ctx, claimSQL, now, agingStep, skipped, now.UnixMicro()).Scan(&id, &doc, &holder, &lease, &c.charged, &c.band, &c.newcomer, &c.ncCharged)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, claimCharge{}, nil
		}
		if err != nil {
			return nil, claimCharge{}, err
		}
		if doc == nil { // claimed or held by another claimer since the statement's snapshot
			skipped = append(skipped, id)
			continue
		}
		op, err := decodeOp(doc, holder, lease)
		return op, c, err
	}
	return nil, claimCharge{}, nil // every candidate was being taken: the caller's next claim looks again
}

// claimCharge is what a claim charged (store.Change.Charged): the charge, the band it was
// claimed in, whether it was a newcomer's, and what it charged its band's newcomers' turn (0 for
// a newcomer's claim that found the row held by another claim: its run then counts there
// whole, as it goes and at its end).
type claimCharge struct {
	charged   int64
	band      int
	newcomer  bool
	ncCharged int64
}

// change is the claim's change of its operation to running.
func (c claimCharge) change() store.Change {
	return store.Change{To: store.StatusRunning, Charged: c.charged, ChargedBand: c.band + 1, ChargedNewcomer: c.newcomer,
		NewcomersCharged: c.ncCharged}
}

// NextQueued returns the operation ClaimNext would claim now, left queued (see store.Queue).
func (s *Store) NextQueued() (*store.Operation, error) {
	var out *store.Operation
	err := s.query(func(ctx context.Context, db querier) error {
		op, err := scanOp(db.QueryRow(ctx, `SELECT `+opColumns+` FROM operations WHERE id = (SELECT n.id FROM (`+
			nextInOrderSQL+`) n)`, s.now(), agingStep, []string{}))
		if isNotFound(err) {
			return nil
		}
		out = op
		return err
	})
	return out, err
}

// ClaimQueued moves queued operation id to running, held by worker, as ClaimNext would were it
// next (see store.Queue).
func (s *Store) ClaimQueued(id, worker string, lease time.Duration) (*store.Operation, error) {
	if !storable(id) {
		return nil, nil
	}
	var out *store.Operation
	err := s.do(func(ctx context.Context, tx pgx.Tx) error {
		now := s.now()
		var arrival int64
		op, err := scanOp(tx.QueryRow(ctx, `SELECT `+opColumns+`, `+laneArrivalSQL+` FROM operations x WHERE x.id = $3 AND `+
			strings.ReplaceAll(claimable, "o.", "x.")+` FOR UPDATE OF x SKIP LOCKED`, now, agingStep, id), &arrival)
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		band := store.EffectiveUrgency(op.Urgency, now.Sub(op.SubmittedAt))
		c := claimCharge{band: band}
		if err := tx.QueryRow(ctx, takeTurnSQL, id, arrival, now.UnixMicro(), band, now).Scan(&c.charged, &c.newcomer, &c.ncCharged); err != nil {
			return err
		}
		out, err = s.startClaimed(ctx, tx, op, c, worker, lease, now)
		return err
	})
	return out, err
}

// StaleQueued returns up to limit queued operations whose QueueDeadline is before now, the
// longest overdue first (see store.Queue).
func (s *Store) StaleQueued(now time.Time, limit int) ([]*store.Operation, error) {
	if limit <= 0 {
		return nil, nil
	}
	var out []*store.Operation
	err := s.query(func(ctx context.Context, db querier) error {
		rows, err := db.Query(ctx, `SELECT `+opColumns+` FROM operations WHERE status = 'queued'
			AND queue_deadline IS NOT NULL AND queue_deadline < $1 ORDER BY queue_deadline LIMIT $2`, now, limit)
		if err != nil {
			return err
		}
		out, err = scanOps(rows)
		return err
	})
	return out, err
}

// QueuedByUrgency counts queued operations by their stored urgency (see store.Queue).
func (s *Store) QueuedByUrgency() ([8]int, error) {
	var out [8]int
	err := s.query(func(ctx context.Context, db querier) error {
		rows, err := db.Query(ctx, `SELECT urgency, count(*) FROM operations WHERE status = 'queued' GROUP BY urgency`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var u, n int
			if err := rows.Scan(&u, &n); err != nil {
				return err
			}
			out[store.ClampUrgency(u)] += n
		}
		return rows.Err()
	})
	return out, err
}

// positionSQL counts, per lane with claimable work at $1, the queued operations before and at
// the effective urgency $3 of operation $4 of lane $5, whose own urgency is $6 (see
// store.ScopeQueue).
var positionSQL = `SELECT q.lane, ` + slotStartSQL("$3::int", "0", "0") + `,
		count(*) FILTER (WHERE q.e < $3), count(*) FILTER (WHERE q.e = $3),
		coalesce(min(q.id) FILTER (WHERE q.e = $3), ''),
		count(*) FILTER (WHERE q.e = $3 AND q.lane = $5 AND (q.own, q.id) < ($6, $4)), t.vturns IS NULL
	FROM (SELECT ` + laneSQL + ` AS lane, o.id, ` + effectiveSQL + ` AS e, ` + ownSQL + ` AS own
		FROM operations o WHERE ` + claimable + `) q
	` + turnJoinsSQL("q.lane", "$3::int") + `
	GROUP BY q.lane, t.vturns, nc.vturn, nd.vturn, v.vturn, a.hold`

// QueuePosition estimates how many queued operations will be claimed before id (see
// store.Queue): one pass over the queued operations, counted per scope.
func (s *Store) QueuePosition(id string) (int, error) {
	if !storable(id) {
		return 0, store.ErrNotFound
	}
	var pos int
	err := s.query(func(ctx context.Context, db querier) error {
		now := s.now()
		var lane string
		op, err := scanOp(db.QueryRow(ctx, `SELECT `+opColumns+`, `+laneSQL+` FROM operations o WHERE id = $1 AND status = 'queued'`, id), &lane)
		if err != nil {
			return err
		}
		level := store.EffectiveUrgency(op.Urgency, now.Sub(op.SubmittedAt))
		own := store.OwnUrgency(op.Urgency, op.Lift, now.Sub(op.SubmittedAt))
		rows, err := db.Query(ctx, positionSQL, now, agingStep, level, id, lane, own)
		if err != nil {
			return err
		}
		defer rows.Close()
		var scopes []store.ScopeQueue
		for rows.Next() {
			var sq store.ScopeQueue
			if err := rows.Scan(&sq.Scope, &sq.Turn, &sq.Before, &sq.Level, &sq.Oldest, &sq.Ahead, &sq.Newcomer); err != nil {
				return err
			}
			scopes = append(scopes, sq)
		}
		pos = store.EstimatePosition(lane, scopes)
		return rows.Err()
	})
	return pos, err
}

// timeOrNull is t for a nullable column: NULL when zero.
func timeOrNull(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// sweepCapacity forgets the turns of lanes left without queued or running work for
// store.KeepIdleLanesFor at now (their next work then waits with the newcomers, as on Badger
// past store.KeepIdleLanes; the newcomers' turns are kept): it notes when it first finds a lane
// so (idle_since, which a claim clears), and forgets the turn once that is old enough, a batch
// of each. It also deletes lapsed seats (on the database's clock, which leases them), the
// places in line of replicas that stopped looking, those no look holds, and the fleet's turns
// for shared seats last written over store.KeepIdleLanesFor ago that no live seat counts in
// (store.SeatTurns).
func sweepCapacity(ctx context.Context, tx pgx.Tx, now time.Time) (turns, seats int64, err error) {
	const idle = `t.lane NOT LIKE '` + newcomersLane + `%'
		AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.scope = t.lane AND o.lane IS NULL AND o.status IN ('queued', 'running'))
		AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.lane = t.lane AND o.status IN ('queued', 'running'))`
	if _, err := tx.Exec(ctx, `UPDATE queue_lanes SET idle_since = $2 WHERE lane IN (SELECT t.lane FROM queue_lanes t
		WHERE t.idle_since IS NULL AND `+idle+` LIMIT $1)`, sweepBatch, now); err != nil {
		return 0, 0, err
	}
	// idle_since is checked again on the row deleted: a claim that cleared it since the
	// statement's snapshot keeps the lane (PostgreSQL checks a row changed meanwhile against the
	// DELETE's own condition, not the subquery's).
	tag, err := tx.Exec(ctx, `DELETE FROM queue_lanes WHERE idle_since < $2 AND lane IN (SELECT t.lane FROM queue_lanes t
		WHERE t.idle_since < $2 AND `+idle+` LIMIT $1)`, sweepBatch, now.Add(-store.KeepIdleLanesFor))
	if err != nil {
		return 0, 0, err
	}
	turns = tag.RowsAffected()
	if err := ensureNewcomers(ctx, tx); err != nil {
		return turns, 0, err
	}
	// The turns schema 10 replicas keep by scope, forgotten as they forget them.
	tag, err = tx.Exec(ctx, `DELETE FROM queue_turns WHERE scope IN (SELECT t.scope FROM queue_turns t
		WHERE NOT EXISTS (SELECT 1 FROM operations o WHERE o.scope = t.scope AND o.status IN ('queued', 'running')) LIMIT $1)`, sweepBatch)
	if err != nil {
		return 0, 0, err
	}
	turns += tag.RowsAffected()
	tag, err = tx.Exec(ctx, clearLapsed("seats", "NOT "+seatLive)) // a replica's look clears its pool's too
	if err != nil {
		return turns, 0, err
	}
	seats = tag.RowsAffected()
	if _, err = tx.Exec(ctx, clearLapsed("seat_waiters", "NOT "+waiterLive)); err != nil { // one row per replica and pool
		return turns, seats, err
	}
	// The fleet's turns for shared seats, forgotten as the lanes' are (store.SeatTurns), but for
	// those a live seat counts in (forgottenSeatTurn); a row another transaction holds is left to
	// the next sweep. A credential minted per call
	// leaves a turn per call: batches until none is left, up to seatTurnBatches of them a sweep
	// (over 1,500 seats a second), so that they do not pile up.
	for range seatTurnBatches {
		tag, err := tx.Exec(ctx, `DELETE FROM seat_turns WHERE ctid = ANY(ARRAY(SELECT ctid FROM seat_turns
			WHERE `+forgottenSeatTurn+` LIMIT $2 FOR UPDATE SKIP LOCKED)) AND `+forgottenSeatTurn, store.KeepIdleLanesFor.Microseconds(), sweepBatch)
		if err != nil || tag.RowsAffected() < sweepBatch {
			return turns, seats, err
		}
	}
	return turns, seats, nil
}

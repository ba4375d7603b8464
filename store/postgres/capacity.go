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
// effective urgency, then the lanes' turns (queue_lanes; store.ClaimTurn), then oldest first. A
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
// (e) and its oldest work there, which give the lane's turn (store.KnownTurn, or
// store.NewcomerTurn with its band's newcomers' row when the lane has none) and place, and of
// the first lane's work at its band picks the lowest own urgency (store.OwnUrgency), then the
// oldest. Its row: the id picked, the lane, the lane's turn and its band.
var nextInOrderSQL = `WITH RECURSIVE ` + headsSQL(` AND o.id <> ALL($3)`) + `,
banded AS (SELECT h.*, (` + effectiveHeadSQL + `)::int AS e, (` + ownHeadSQL + `)::int AS own FROM heads h),
lanes AS (SELECT DISTINCT ON (lane) lane, e, id AS oldest, submitted_at FROM banded ORDER BY lane, e, id),
picks AS (SELECT DISTINCT ON (lane) lane, id FROM banded ORDER BY lane, e, own, id)
SELECT p.id, o.lane, CASE WHEN t.turn IS NULL THEN greatest(` + arrivalTurnSQL + `, nc.turn)
	ELSE greatest(t.turn, ` + arrivalTurnSQL + `) END AS turn, o.e, ` + slotStartSQL + ` AS start, ` + chargeSQL + ` AS charge,
	t.vturn IS NULL AS fresh
FROM lanes o JOIN picks p ON p.lane = o.lane
	LEFT JOIN queue_lanes t ON t.lane = o.lane LEFT JOIN queue_lanes nc ON nc.lane = ` + newcomersLaneSQL("o.e") + `
	LEFT JOIN queue_lanes v ON v.lane = '` + vtimeLane + `'
ORDER BY o.e, 5, o.oldest LIMIT 1`

// vtimeLane is the row of queue_lanes that keeps the virtual time (vturn) and the queue's
// average run (hold), among the newcomers' rows so that every sweep keeps it.
const vtimeLane = newcomersLane + "vtime"

// slotStartSQL is store.LaneStart of a lane's row t (none: NULL columns), its band's newcomers'
// row nc and the virtual time's row v: a lane without vturn has no turn in slot time.
const slotStartSQL = `CASE WHEN t.vturn IS NULL THEN greatest(coalesce(nc.vturn, 0), coalesce(v.vturn, 0))
	ELSE greatest(t.vturn, coalesce(v.vturn, 0)) END`

// chargeSQL is store.ClaimCharge of a lane's row t and the virtual time's row v: the lane's hold
// when it has a turn in slot time and a run measured, else the queue's average.
var chargeSQL = `greatest(CASE WHEN t.vturn IS NOT NULL AND t.hold > 0 THEN t.hold WHEN v.hold > 0 THEN v.hold
	ELSE ` + strconv.FormatInt(store.DefaultHold, 10) + ` END, ` + strconv.FormatInt(store.MinCharge, 10) + `)::bigint`

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
// (store.NewcomerTurn): lanes are fairness keys ("key:...") or scopes (hex digests), so none is
// ever an operation's. The rows are made at open and by the sweep (ensureNewcomers), never by a
// claim: a claim that inserted one would wait for every claim holding it.
const newcomersLane = "*newcomers:"

// newcomersLaneSQL is the newcomers' row of the band of expression e (an integer 0..7).
func newcomersLaneSQL(e string) string { return `('` + newcomersLane + `' || ` + e + `)` }

// newcomersSQL are the CTEs that move the newcomers' turns on for a claim at $now (microseconds)
// of a row of src (columns lane, e: its band, start, charge and fresh: whether the lane had no
// turn in slot time). The turn of schema 17 and before (store.NewcomersServed) moves when the
// lane had no row before the statement, to just before the claim or the turn handed out (CTE
// turn, column t); the turn in slot time (store.NewcomersAfter) when the lane had no vturn. The
// virtual time moves to the claim's start. A row is updated unless another claim holds it (SKIP
// LOCKED: that claim moves it on to about the same), so the claims on every replica never wait
// for one another there.
func newcomersSQL(src string, now int) string {
	return `nc_new AS (SELECT s.e, s.start, s.charge, NOT EXISTS (SELECT 1 FROM queue_lanes t WHERE t.lane = s.lane) AS absent
	FROM ` + src + ` s WHERE s.fresh),
nc_moved AS (UPDATE queue_lanes q SET turn = CASE WHEN n.absent THEN greatest(q.turn, $` + strconv.Itoa(now) + `::bigint - 1, (SELECT max(t) FROM turn) - 1)
		ELSE q.turn END,
	vturn = greatest(coalesce(q.vturn, 0), n.start + n.charge - 1)
	FROM nc_new n WHERE q.lane = ` + newcomersLaneSQL("n.e") + ` AND q.lane IN (SELECT l.lane FROM queue_lanes l
		WHERE l.lane IN (SELECT ` + newcomersLaneSQL("m.e") + ` FROM nc_new m) FOR UPDATE SKIP LOCKED)),
v_moved AS (UPDATE queue_lanes q SET vturn = greatest(coalesce(q.vturn, 0), s.start) FROM ` + src + ` s
	WHERE q.lane IN (SELECT l.lane FROM queue_lanes l WHERE l.lane = '` + vtimeLane + `' FOR UPDATE SKIP LOCKED))`
}

// ensureNewcomers makes the newcomers' rows that are missing: at open, and at each sweep, since
// an older release's sweep takes them for lanes without work and deletes them. Only those missing
// from its snapshot are inserted: inserting one that exists would wait for any claim moving it.
func ensureNewcomers(ctx context.Context, db querier) error {
	_, err := db.Exec(ctx, `INSERT INTO queue_lanes (lane, turn) SELECT l, 0 FROM (SELECT `+newcomersLaneSQL("u")+` AS l
		FROM generate_series(`+strconv.Itoa(store.MostUrgent)+`, `+strconv.Itoa(store.LeastUrgent)+`) u
		UNION ALL SELECT '`+vtimeLane+`') n
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
// (store.ChargedTurn): src's start moved on by its charge over the weight, or from the locked
// latest vturn when a claim on another replica moved it on since src's snapshot.
func laneTurnSQL(src string, now int) string {
	next := `setval('queue_turn_seq', greatest(nextval('queue_turn_seq'), $` + strconv.Itoa(now) + `::bigint))`
	return `INSERT INTO queue_lanes AS q (lane, turn, credit, weight, vturn)
	SELECT s.lane, CASE WHEN 1 < s.w THEN s.arrival ELSE ` + next + ` END, CASE WHEN 1 < s.w THEN 1 ELSE 1 - s.w END, s.w,
		s.start + greatest(floor(s.charge / s.w::float8)::bigint, 1)
	FROM (SELECT lane, arrival, start, charge, least(greatest(coalesce(weight, 1), 1), ` + strconv.Itoa(store.MaxWeight) + `)::real AS w
		FROM ` + src + `) s
	ON CONFLICT (lane) DO UPDATE SET
		turn = CASE WHEN q.credit + 1 < excluded.weight THEN greatest(q.turn, excluded.turn)
			WHEN 1 < excluded.weight THEN ` + next + ` ELSE excluded.turn END,
		credit = CASE WHEN q.credit + 1 < excluded.weight THEN q.credit + 1 ELSE q.credit + 1 - excluded.weight END,
		vturn = CASE WHEN q.vturn IS NULL THEN excluded.vturn
			ELSE greatest(excluded.vturn, q.vturn + (SELECT greatest(floor(x.charge / least(greatest(coalesce(x.weight, 1), 1), ` + strconv.Itoa(store.MaxWeight) + `)::real::float8)::bigint, 1)
				FROM ` + src + ` x LIMIT 1)) END,
		weight = excluded.weight, idle_since = NULL
	RETURNING q.turn AS t`
}

// takeTurnSQL gives the lane of operation $1 the turn of a claim at $3, $2 its arrival turn
// (laneArrivalSQL) should it have none (laneTurnSQL; the newcomers' turn of its band $4 when later, which the claim then
// moves on: newcomersSQL). The lane and weight are the row's: an operation accepted by a schema
// 10 replica has no lane column, and waits in its scope's lane.
var takeTurnSQL = `WITH one AS (SELECT ` + laneSQL + ` AS lane, CASE WHEN t.turn IS NULL THEN greatest($2::bigint, nc.turn)
		ELSE greatest(t.turn, $2::bigint) END AS arrival, o.weight, $4::int AS e,
		` + slotStartSQL + ` AS start, ` + chargeSQL + ` AS charge, t.vturn IS NULL AS fresh
	FROM operations o LEFT JOIN queue_lanes t ON t.lane = ` + laneSQL + `
		LEFT JOIN queue_lanes nc ON nc.lane = ` + newcomersLaneSQL("$4::int") + `
		LEFT JOIN queue_lanes v ON v.lane = '` + vtimeLane + `' WHERE o.id = $1),
turn AS (` + laneTurnSQL("one", 3) + `),
` + newcomersSQL("one", 3) + `
SELECT charge, CASE WHEN fresh THEN e + 1 ELSE 0 END FROM one`

// settleRunSQL settles the turns of a run that ended (store.Run, as Badger's queueOrder.ran):
// its lane's turn in slot time, when it has one, and its band's newcomers' ($5: 1 + the band, 0
// for none) corrected by what it cost beyond its claim's charge ($2, $4; store.SettledTurn), and
// the lane's and the queue's averages taught the time it ran ($3 microseconds; none when 0). The
// newcomers' and the queue's rows are passed over when a claim holds them (SKIP LOCKED): a run's
// end never waits for a claim there, and the two could otherwise each wait for the other.
var settleRunSQL = `WITH v AS (SELECT coalesce((SELECT vturn FROM queue_lanes WHERE lane = '` + vtimeLane + `'), 0) AS t),
lane AS (UPDATE queue_lanes q SET vturn = greatest(q.vturn + $2::bigint, least(q.vturn, (SELECT t FROM v))),
		hold = CASE WHEN $3::bigint > 0 THEN ` + movedHoldSQL("q.hold") + ` ELSE q.hold END
	WHERE q.lane = $1 AND q.vturn IS NOT NULL),
nc AS (UPDATE queue_lanes q SET vturn = greatest(coalesce(q.vturn, 0) + $4::bigint, least(coalesce(q.vturn, 0), (SELECT t FROM v)))
	WHERE q.lane IN (SELECT l.lane FROM queue_lanes l WHERE $5::int > 0 AND l.lane = ` + newcomersLaneSQL("($5::int - 1)") + `
		FOR UPDATE SKIP LOCKED)),
average AS (UPDATE queue_lanes q SET hold = ` + movedHoldSQL("q.hold") + `
	WHERE $3::bigint > 0 AND q.lane IN (SELECT l.lane FROM queue_lanes l WHERE l.lane = '` + vtimeLane + `' FOR UPDATE SKIP LOCKED))
SELECT 1`

// movedHoldSQL is store.MovedHold of the average h and the run's time $3.
func movedHoldSQL(h string) string {
	return `CASE WHEN coalesce(` + h + `, 0) <= 0 THEN $3::bigint ELSE ` + h + ` + (least($3::bigint, 10 * ` + h + `) - ` + h + `) / 5 END`
}

// settleRun settles run r's turns (settleRunSQL) through w.
func settleRun(ctx context.Context, w execer, r store.Run) error {
	_, err := w.Exec(ctx, settleRunSQL, store.LaneText(r.Lane), r.Delta(), r.Took, r.NewcomersDelta(), r.NewcomerBand)
	return err
}

// claimTries bounds how many rows one claim passes over because other claimers hold them: more
// than the workers claiming at once on every replica, or a claim would answer "none" with work
// queued (its worker would then wait for the next wake-up).
const claimTries = 128

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
claimed AS (SELECT o.doc, o.holder, o.lease_until, n.lane, n.turn AS arrival, o.weight, n.e, n.start, n.charge, n.fresh
	FROM operations o JOIN next n ON o.id = n.id WHERE o.status = 'queued' FOR UPDATE OF o SKIP LOCKED),
turn AS (` + laneTurnSQL("claimed", 4) + `),
` + newcomersSQL("claimed", 4) + `
SELECT n.id, c.doc, c.holder, c.lease_until, n.charge, CASE WHEN n.fresh THEN n.e + 1 ELSE 0 END FROM next n LEFT JOIN claimed c ON true`

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
		err := tx.QueryRow(ctx, claimSQL, now, agingStep, skipped, now.UnixMicro()).Scan(&id, &doc, &holder, &lease, &c.charged, &c.band)
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

// claimCharge is what a claim charged (store.Change.Charged, store.Change.NewcomerBand).
type claimCharge struct {
	charged int64
	band    int
}

// change is the claim's change of its operation to running.
func (c claimCharge) change() store.Change {
	return store.Change{To: store.StatusRunning, Charged: c.charged, NewcomerBand: c.band}
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
		var c claimCharge
		if err := tx.QueryRow(ctx, takeTurnSQL, id, arrival, now.UnixMicro(), band).Scan(&c.charged, &c.band); err != nil {
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
var positionSQL = `SELECT q.lane, ` + slotStartSQL + `,
		count(*) FILTER (WHERE q.e < $3), count(*) FILTER (WHERE q.e = $3),
		coalesce(min(q.id) FILTER (WHERE q.e = $3), ''),
		count(*) FILTER (WHERE q.e = $3 AND q.lane = $5 AND (q.own, q.id) < ($6, $4)), t.vturn IS NULL
	FROM (SELECT ` + laneSQL + ` AS lane, o.id, ` + effectiveSQL + ` AS e, ` + ownSQL + ` AS own
		FROM operations o WHERE ` + claimable + `) q
	LEFT JOIN queue_lanes t ON t.lane = q.lane LEFT JOIN queue_lanes nc ON nc.lane = ` + newcomersLaneSQL("$3::int") + `
	LEFT JOIN queue_lanes v ON v.lane = '` + vtimeLane + `'
	GROUP BY q.lane, t.vturn, nc.vturn, v.vturn`

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
// for shared seats taken over store.KeepIdleLanesFor ago (store.SeatTurns).
func sweepCapacity(ctx context.Context, tx pgx.Tx, now time.Time) (turns, seats int64, err error) {
	const idle = `t.lane NOT LIKE '` + newcomersLane + `%'
		AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.scope = t.lane AND o.lane IS NULL AND o.status IN ('queued', 'running'))
		AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.lane = t.lane AND o.status IN ('queued', 'running'))`
	if _, err := tx.Exec(ctx, `UPDATE queue_lanes SET idle_since = $2 WHERE lane IN (SELECT t.lane FROM queue_lanes t
		WHERE t.idle_since IS NULL AND `+idle+` LIMIT $1)`, sweepBatch, now); err != nil {
		return 0, 0, err
	}
	tag, err := tx.Exec(ctx, `DELETE FROM queue_lanes WHERE lane IN (SELECT t.lane FROM queue_lanes t
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
	// The fleet's turns for shared seats, forgotten as the lanes' are (store.SeatTurns); those a
	// seat taken holds at the moment are left to the next sweep. A credential minted per call
	// leaves a turn per call: batches until none is left, up to seatTurnBatches of them a sweep
	// (over 1,500 seats a second), so that they do not pile up.
	for range seatTurnBatches {
		tag, err := tx.Exec(ctx, `DELETE FROM seat_turns WHERE ctid = ANY(ARRAY(SELECT ctid FROM seat_turns
			WHERE turn < clock_timestamp() - $1 * interval '1 microsecond' LIMIT $2 FOR UPDATE SKIP LOCKED))
			AND turn < clock_timestamp() - $1 * interval '1 microsecond'`, store.KeepIdleLanesFor.Microseconds(), sweepBatch)
		if err != nil || tag.RowsAffected() < sweepBatch {
			return turns, seats, err
		}
	}
	return turns, seats, nil
}

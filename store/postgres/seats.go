package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store"
)

// Seats shared by the replicas on one database (capacity `shared N`, docs/backends.md): a seat is
// a row held by a worker until a time it renews; a replica that dies stops renewing, and its
// seats lapse and stop counting.
//
// A seat's lease is set and read on the database's clock (clock_timestamp(), the time of the
// statement rather than of its transaction), never on a replica's: replicas whose clocks
// disagree still agree on which seats are live, so a replica running ahead cannot take a live
// seat, nor one running behind keep a lapsed one. The replicas send lengths of time only.

// seatLive is the condition of a live seat, on the database's clock.
const seatLive = `until > clock_timestamp()`

// waiterLive is the condition of a place in line whose replica still looks (seat_waiters): its
// `until`, on the database's clock, as a seat's.
const waiterLive = seatLive

// clearLapsed deletes the rows of table that match lapsed and that no other transaction holds.
// Clearing lapsed rows never waits for a row lock: every replica's look and the sweep clear
// them, each in its own order, and two that each held a row the other wanted next would
// deadlock (PostgreSQL then fails one of them). A row skipped is cleared by a later look;
// what counts rows counts only live ones meanwhile.
func clearLapsed(table, lapsed string) string {
	return `DELETE FROM ` + table + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + table + ` WHERE ` + lapsed +
		` FOR UPDATE SKIP LOCKED)) AND ` + lapsed
}

// leaseEnd is the end of a lease of $n microseconds begun now on the database's clock.
func leaseEnd(n int) string {
	return fmt.Sprintf(`clock_timestamp() + $%d * interval '1 microsecond'`, n)
}

// seatLockClass is the first key of the two-key advisory lock that serializes acquisitions in one
// pool (hashtext(pool) is the second); two-key locks never collide with the one-key locks of
// migrations and the sweep.
const seatLockClass int32 = 0x6d756c6c

// The Store shares seats between replicas.
var _ store.SharedSeats = (*Store)(nil)

// waiterLease is how long a worker's place in a pool's order outlives its last look: many of
// its looks (every 20 ms while it has waiters), so a replica that died, or stopped looking,
// holds back the others' waiters only this long.
const waiterLease = time.Second

// AcquireSeat takes one of limit seats of pool for worker for lease, for its call w, in the
// fleet's order; false when limit live seats are held or the free ones are due to better calls
// of other workers (see store.SharedSeats). Taking a seat already held renews it.
//
// Counting then inserting is a race between two replicas unless they take turns, so a look
// that may take a seat holds the pool's advisory lock (one that only stands its call in line
// needs none: lockIfFitSQL); it sends the lock and its statements in one round trip
// (acquireSeat), so that the lock is held briefly and places in line (one second) do not lapse
// while another replica waits for it.
func (s *Store) AcquireSeat(pool, seat, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	return s.acquireSeat(pool, "", seat, worker, limit, lease, w)
}

// The Store hands seats over.
var _ store.SeatHandover = (*Store)(nil)

// HandOverSeat releases seat and takes next for worker's call w in one transaction (see
// store.SeatHandover): one commit where a release and a look took two, with a notice and a
// wake-up between them.
func (s *Store) HandOverSeat(pool, seat, next, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	got, err := s.acquireSeat(pool, seat, next, worker, limit, lease, w)
	if err == nil && !got {
		s.seats.note(pool) // the freed seat is another replica's call's: tell them
	}
	return got, err
}

// acquireSeat is AcquireSeat, releasing seat freed first when it is not empty (HandOverSeat).
// The look is one batch in one round trip, an implicit transaction: its lock timeout and its
// start (lookAt), the pool's lock when the look may take a seat (lockIfFitSQL), the seat freed,
// the lapsed rows cleared, then one statement that counts the live seats, ranks the call against
// the others in line, and either takes the seat (leaving the line, moving the key's turn on) or
// stands the call in line. The lock is thus held for no round trip at all.
func (s *Store) acquireSeat(pool, freed, seat, worker string, limit int, lease time.Duration, w store.SeatWaiter) (bool, error) {
	got := false
	err := s.query(func(ctx context.Context, db querier) error {
		got = false
		args := []any{pool, seat, worker, limit, lease.Microseconds(), lineUrgency(w), w.Waited.Microseconds(),
			waiterLease.Microseconds(), lineKey(w), freed != "", handoverReorder.Microseconds(), lineWaiting(w),
			store.Weight(w.Weight)}
		var look pgx.Batch
		// seatsAt is set for the decision before the lock, and again once the lock is held.
		look.Queue(`SELECT set_config('lock_timeout', $1, true), set_config('`+lookAt+`', clock_timestamp()::text, true), `+genericPlans+
			`, `+seatsAtNow, lookLockTimeout(s.opts.Timeout))
		if freed != "" { // a handover frees a seat: it writes the turns, under the lock
			look.Queue(`SELECT set_config('`+seatLocked+`', 'true', true), pg_advisory_xact_lock($1, hashtext($2))`, seatLockClass, pool)
		} else {
			look.Queue(lockIfFitSQL, append(args, seatLockClass)...)
		}
		look.Queue(setSeatsAt)
		if freed != "" {
			look.Queue(`WITH `+freeSeatSQL+` SELECT count(*) FROM freed`, pool, freed)
		}
		look.Queue(clearLapsed("seats", "pool = $1 AND NOT "+seatLive+" AND "+lockHeld), pool)
		look.Queue(clearLapsed("seat_waiters", "pool = $1 AND NOT "+waiterLive+" AND "+lockHeld), pool)
		look.Queue(takeSeatSQL, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&got) })
		return s.pool.SendBatch(ctx, &look).Close()
	})
	return got, err
}

// seatLocked is the setting, local to a look's transaction, that says whether it holds the
// pool's lock: a look takes a seat, and clears lapsed rows, only under it.
const seatLocked = "mulligan.seat_locked"

// lockHeld is true in a look that holds the pool's lock (seatLocked). A look without it writes
// its own place in line and nothing else: clearing another replica's lapsed place, it held that
// row while it waited for its own, which a look under the lock that had cleared its lapsed place
// held while it waited for the other's (a deadlock, and a call answered 503).
const lockHeld = `current_setting('` + seatLocked + `')::bool`

// lockIfFitSQL decides whether a look that frees no seat takes the pool's lock, and takes it:
// with takeSeatSQL's parameters, and $14 the lock's class (seatLockClass). The lock serializes
// the looks that may take a seat (counting the seats, then taking one, is a race between two
// replicas otherwise) and everything that writes the turns. Most looks only stand their call in
// line again: a poll while every seat is held, and the replicas a freed seat's notice woke whose
// calls are not first. Those need no lock, and waiting for it behind one another they held back
// the look that would take the seat, while the model server's slot behind it stood idle
// (docs/capacity.md, "Many replicas"). So a look takes it when its call fits (seatDecisionSQL,
// here before the lock: a free seat and not as many better calls in line; not reckoned when it
// locks anyway), or when its replica has no place in line that stands for placeMargin yet. A
// look without the lock only stands its place (takeSeatSQL takes a seat, and the look clears
// lapsed rows, only under it: lockHeld). Should a seat come free after the decision, its
// release sees the place that was live then and tells the replicas (ReleaseSeat, HandOverSeat),
// and the replica looks again; a first place is stood under the lock, so that no seat freed
// meanwhile goes untold. Where no notice comes (a pooler without a direct connection for
// LISTEN, a listener reconnecting), the replica finds the seat at its next poll, as it would
// any seat freed. ($5, $8, $12 and $13 are takeSeatSQL's, unused here: a statement's
// parameters are numbered without gaps.)
var lockIfFitSQL = `WITH ` + seatDecisionSQL + `
	SELECT set_config('` + seatLocked + `', l.lock::text, true), CASE WHEN l.lock THEN pg_advisory_xact_lock($14, hashtext($1)) END
	FROM (SELECT NOT EXISTS (SELECT 1 FROM seat_waiters w WHERE w.pool = $1 AND w.worker = $3
			AND w.until > clock_timestamp() + ` + placeMargin + `) OR (SELECT fit.fit FROM fit) AS lock
		FROM (SELECT $5::bigint, $8::bigint, $12::int[], $13::float8) unused) l`

// placeMargin is how long a replica's place in line must still stand for a look to stand it
// again without the pool's lock: a release that ran while it was no longer live, and before the
// look's new place committed, would tell no replica of the seat it freed (found at the next
// poll, 20 ms later). A place is stood again at every look, every 20 ms at most while calls wait.
const placeMargin = `interval '500 milliseconds'`

// handoverReorder is how much sooner than a handover's own call another replica's call of the
// same key and urgency may have come and still not go before it: within it, the seat stays on
// its replica. A seat that goes to another replica stands idle for a commit, a notice and that
// replica's look (about twice a handover's time, BenchmarkASharedSeatPassed) while the model
// server's slot behind it does nothing. The bound is in arrival time: a call can be passed by
// any number of its key's calls that came within this after it, none that came later. Calls of
// other keys, of another urgency and of no key keep the line's order, so what a key gets
// against the others does not change. It is a poll of a replica's waiters (internal/capacity's
// sharedPoll); docs/capacity.md, "Many replicas", has the benchmark.
const handoverReorder = 20 * time.Millisecond

// genericPlans has the rest of a look's or a release's transaction run its statements on
// generic plans. Their statements are large (the line's order, the turns in slot time) and
// run for every seat: PostgreSQL planned them anew at each run (a custom plan, as it does
// while it weighs one against a generic plan), which took longer than running them; their
// parameters never change the best plan (index lookups by pool and key), so the plan a
// connection prepared once is kept. Through a pooler a statement is planned at each run all
// the same (no statement is prepared there: pooledExecMode). BenchmarkASharedSeatPassed:
// docs/capacity.md.
const genericPlans = `set_config('plan_cache_mode', 'force_generic_plan', true)`

// lookLockTimeout is how long a look waits for the pool's lock, and for any row it writes
// (PostgreSQL's lock_timeout, in milliseconds, for the look's transaction only): half the call's
// timeout. The replica stops waiting for an answer at the call's timeout, while PostgreSQL would
// run the look on once it got the lock and commit it, a place stood or a seat taken that the
// replica counts as not done; a look aborted by the server first has done nothing.
func lookLockTimeout(call time.Duration) string {
	return strconv.FormatInt(max(call/2, time.Millisecond).Milliseconds(), 10)
}

// seatDecisionSQL and takeSeatSQL decide a look (acquireSeat) in one statement: $1 pool, $2
// seat, $3 worker, $4 limit, $5 lease and $8 the place's lease (microseconds), $6 the call's
// urgency in line, $7 how long it waited (microseconds), $9 its key (NULL: none), $13 the key's
// weight. The call fits (seatDecisionSQL) when fewer than limit other live seats are held and
// it is held already (a renewal keeps its place, whoever waits), or not as many better calls of other
// workers stand in line as there are free seats (aheadSQL; in a handover, $10 true, a call of
// the same key and urgency only when it came more than $11 microseconds sooner:
// handoverReorder), counting only workers whose limit is above the seats held (replicas whose
// `shared N` differ, during a reload rolling through the fleet, hold back no seat they cannot
// take). The seat is taken when the call fits and the look holds the pool's lock (seatLocked:
// lockIfFitSQL); the ranking is left out when every seat is held. Taken, the call leaves the line, and its lane's turn moves on from where it stood in
// line by the take's charge (the newcomers' for a key without a turn, whose key then gets one),
// as does its band's virtual time to where it stood (store.SeatTurns); else it stands in line,
// its worker's one place moved to it. The statement's parts all see the tables as they were
// before it: worker's own place is left out of the ranking. A look that only stands its call in
// line ($10 false: it frees no seat) commits without waiting for the WAL's flush (the next look
// stands the place again should a crash lose it); one that takes or frees a seat commits as the
// server is set to.
var seatDecisionSQL = `st AS (
		SELECT count(*) FILTER (WHERE seat <> $2) AS held, coalesce(bool_or(seat = $2), false) AS renewal
		FROM seats WHERE pool = $1 AND ` + seatLive + `),
	me AS (SELECT $6::int AS urgency, ` + placeSinceSQL("$7", "$9") + ` AS since, ` + cameSQL("$7") + ` AS came,
		$3::text AS worker, $9::text AS key, ` + lineTagSQL("$9::text", "$6::int") + ` AS tag),
	older AS (SELECT EXISTS (SELECT 1 FROM seat_waiters o WHERE o.pool = $1 AND o.worker <> $3 AND o.` + waiterLive + `
		AND o.slot_turns IS NOT TRUE) AS stand),
	ahead AS (SELECT count(*) AS n FROM seat_waiters a, me, st, older
		WHERE a.pool = $1 AND a.worker <> $3 AND a.seat_limit > st.held AND a.` + waiterLive + `
		AND ` + aheadSQL("a", "me", "older.stand") + `
		AND NOT ($10::bool AND a.key = me.key AND a.urgency = me.urgency
			AND coalesce(a.came, a.since) > me.came - $11 * interval '1 microsecond') IS TRUE),
	fit AS (SELECT st.held < $4 AND (st.renewal OR (SELECT ahead.n FROM ahead) < $4 - st.held) AS fit, st.renewal FROM st)`

var takeSeatSQL = `WITH ` + seatDecisionSQL + `,
	d AS (SELECT l.locked AND (SELECT fit.fit FROM fit) AS served, (SELECT st.renewal FROM st) AS renewal
		FROM (SELECT current_setting('` + seatLocked + `')::bool AS locked) l),
	ch AS (SELECT floor(coalesce(greatest((SELECT t.hold FROM seat_turns t WHERE t.pool = $1 AND t.key = $9::text),
			(SELECT t.hold FROM seat_turns t WHERE t.pool = $1 AND t.key = '` + seatAverage + `')), 0) / p.per)::bigint AS c, p.per,
		$9::text IS NOT NULL AND NOT EXISTS (SELECT 1 FROM seat_turns WHERE pool = $1 AND key = $9::text AND vturn IS NOT NULL) AS newcomer
		FROM (SELECT greatest($4, 1) * greatest($13::float8, 1) AS per) p),
	place AS (INSERT INTO seat_waiters (pool, worker, urgency, seat_limit, since, came, until, key, waiting, slot_turns)
		SELECT $1, $3, me.urgency, $4, me.since, me.came, ` + leaseEnd(8) + `, me.key, $12::int[], true FROM me, d WHERE NOT d.served` + placeInLine + `),
	served AS (DELETE FROM seat_waiters WHERE pool = $1 AND worker = $3 AND (SELECT served AND NOT renewal FROM d)),
	taken AS (INSERT INTO seats (pool, seat, worker, until, key, taken_at, charged, per, newcomer, band)
		SELECT $1, $2, $3, ` + leaseEnd(5) + `, $9::text, clock_timestamp(), ch.c, ch.per, ch.newcomer, $6 FROM d, ch WHERE d.served
		ON CONFLICT (pool, seat) DO UPDATE SET worker = $3, until = EXCLUDED.until),
	newcomers AS (INSERT INTO seat_turns (pool, key, turn, vturn, seen)
		SELECT $1, '` + store.SeatNewcomers + `', clock_timestamp(), me.tag + ch.c * interval '1 microsecond', clock_timestamp()
		FROM d, ch, me WHERE d.served AND NOT d.renewal AND ch.newcomer AND $9::text <> '` + store.SeatNewcomers + `'
		ON CONFLICT (pool, key) DO UPDATE SET turn = EXCLUDED.turn, vturn = ` + movedTurnSQL + `, seen = EXCLUDED.seen),
	turn AS (INSERT INTO seat_turns (pool, key, turn, vturn, seen)
		SELECT $1, $9::text, clock_timestamp(), me.tag + ch.c * interval '1 microsecond', clock_timestamp()
		FROM d, ch, me WHERE d.served AND NOT d.renewal AND $9::text IS NOT NULL
		ON CONFLICT (pool, key) DO UPDATE SET turn = EXCLUDED.turn, vturn = ` + movedTurnSQL + `, seen = EXCLUDED.seen),
	vtime AS (INSERT INTO seat_turns (pool, key, turn, vturn, seen) SELECT $1, ` + vtimeKeySQL("$6::int") + `, clock_timestamp(), me.tag, clock_timestamp()
		FROM d, me WHERE d.served AND NOT d.renewal
		ON CONFLICT (pool, key) DO UPDATE SET turn = EXCLUDED.turn, vturn = greatest(seat_turns.vturn, EXCLUDED.vturn), seen = EXCLUDED.seen)
	SELECT served FROM d, (SELECT set_config('synchronous_commit', CASE WHEN d.served OR $10::bool THEN current_setting('synchronous_commit') ELSE 'off' END, true) FROM d) sync`

// lineWaiting is w's worker's counts of calls waiting as its place keeps them: nil when not
// counted.
func lineWaiting(w store.SeatWaiter) []int32 {
	if w.Waiting == ([8]int{}) {
		return nil
	}
	out := make([]int32, len(w.Waiting))
	for i, n := range w.Waiting {
		out[i] = int32(n)
	}
	return out
}

// SeatWaitersByUrgency counts the calls every replica has waiting for a seat of pool, by
// urgency, from the live places in its line: each keeps its replica's counts as of its latest
// look, and one that keeps none (a binary of schema 16) counts as one call at its urgency.
func (s *Store) SeatWaitersByUrgency(pool string) ([8]int, error) {
	var out [8]int
	err := s.query(func(ctx context.Context, db querier) error {
		out = [8]int{}
		rows, err := db.Query(ctx, `SELECT c.u, sum(c.n)::bigint FROM seat_waiters w CROSS JOIN LATERAL (
				SELECT i - 1 AS u, w.waiting[i] AS n FROM generate_subscripts(w.waiting, 1) i
				UNION ALL SELECT w.urgency, 1 WHERE w.waiting IS NULL) c
			WHERE w.pool = $1 AND w.`+waiterLive+` AND c.u BETWEEN 0 AND 7 GROUP BY c.u`, pool)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var u int32
			var n int64
			if err := rows.Scan(&u, &n); err != nil {
				return err
			}
			out[u] = int(n)
		}
		return rows.Err()
	})
	return out, err
}

// lineKey is w's key as the line keeps it: nil without one (a call of no scope), which waits
// from when it came, no turn counted (as a schema 15 replica's place, which keeps its own turns).
func lineKey(w store.SeatWaiter) *string {
	if k := store.LaneText(w.Key); k != "" {
		return &k
	}
	return nil
}

// The fleet's line for shared seats is start-time fair queuing over slot time (store.SeatTurns),
// as the durable queue's order is (docs/backends.md, "The capacity order"): a key's turn (a row
// of seat_turns, its vturn: a time on the database's clock moved by slot time) moves on with
// each seat its calls take by the slot time its seats held lately (hold), or the pool's average
// (the row seatAverage) when that is longer, over per: the pool's seats times the key's weight;
// a seat held past its charge counts in its key's turn while it is held (turnNowSQL), and its
// release corrects the turn to the time it held (freeSeatSQL). Each band has a virtual time (the
// row vtimeKeySQL of the band): where the latest call taken in it stood in line. A call stands
// in line at the later of its key's turn (the newcomers' for a key without one: keys without a
// turn share one) and its band's virtual time (lineTagSQL), so a key that comes back after a
// while starts at the virtual time, not ahead of every key that kept calling, nor behind them;
// a key seen for the first time no sooner than that (credentials minted per call move the
// newcomers' one turn on together). A row's turn is still when the key last took a seat, on the clock,
// as a binary of schema 19 keeps it and reads it (oldLineTurnSQL); the sweep keeps a row while a
// live seat counts in it. A seat that lapses (its replica died, and its call with it) takes back
// what it counted while it was held: only a release settles it.

// seatsAt is the instant a look, or a read of the turns, reckons the seats' time at: when it got
// the pool's lock (setSeatsAt), on the database's clock.
const seatsAt = `current_setting('mulligan.seats_at')::timestamptz`

// setSeatsAt sets seatsAt for the rest of the transaction (seatsAtNow in a statement's list).
const setSeatsAt = `SELECT ` + seatsAtNow

const seatsAtNow = `set_config('mulligan.seats_at', clock_timestamp()::text, true)`

// seatAverage is the row of seat_turns whose hold is the pool's average hold, charged to a key
// never measured: never a fairness key ("key:..."), a scope (a hex digest) nor SeatNewcomers.
const seatAverage = "*average"

// vtimeKeySQL is the key of the row of seat_turns that holds band u's virtual time
// (store.SeatBandTime).
func vtimeKeySQL(u string) string { return `'*vtime:' || ` + u }

// seatVtimeSQL is band u's virtual time in pool $1: its own, or when it has none (never a call taken
// in it lately) the latest of the other bands', or the clock when no band has one.
func seatVtimeSQL(u string) string {
	return `coalesce((SELECT t.vturn FROM seat_turns t WHERE t.pool = $1 AND t.key = ` + vtimeKeySQL(u) + `),
		(SELECT max(t.vturn) FROM seat_turns t WHERE t.pool = $1 AND t.key LIKE '*vtime:%'), ` + seatsAt + `)`
}

// overrunSQL is what the live seats of turn row t (of pool $1) held past what their takes
// charged, an interval of turn: its key's seats, or for the newcomers' row the seats taken in
// their turn. It is reckoned at one instant (seatsAt) for every place a look compares: reckoned
// as each is read, a place read later counted a little more of a long seat, and two replicas'
// calls of one key, whose turns are the same, each ranked their own first.
func overrunSQL(t string) string {
	return `coalesce((SELECT sum(greatest(floor(extract(epoch FROM ` + seatsAt + ` - s.taken_at) * 1000000 / s.per) - s.charged, 0))
		FROM seats s WHERE s.pool = $1 AND s.taken_at IS NOT NULL AND s.per > 0 AND s.` + seatLive + `
		AND CASE WHEN ` + t + `.key = '` + store.SeatNewcomers + `' THEN s.newcomer ELSE s.key = ` + t + `.key END), 0)::float8 * interval '1 microsecond'`
}

// turnNowSQL is turn row t's turn as it is now: with what its live seats held past their charge.
func turnNowSQL(t string) string { return t + `.vturn + ` + overrunSQL(t) }

// lineTagSQL is where a call of key k (NULL: none) and band u stands in pool $1's line: the later
// of its key's turn as it is now, the newcomers' for a key without one, and its band's virtual
// time; a call of no key stands at the virtual time.
func lineTagSQL(k, u string) string {
	return `greatest(CASE WHEN ` + k + ` IS NOT NULL THEN coalesce(
		(SELECT ` + turnNowSQL("t") + ` FROM seat_turns t WHERE t.pool = $1 AND t.key = ` + k + `),
		(SELECT ` + turnNowSQL("t") + ` FROM seat_turns t WHERE t.pool = $1 AND t.key = '` + store.SeatNewcomers + `')) END, ` + seatVtimeSQL(u) + `)`
}

// movedTurnSQL is the turn of an existing row of seat_turns moved on by a call that took a seat:
// from where the call stood in line (me.tag: the later of the turn as it is now and the virtual
// time), by the take's charge, less what the row's live seats count past their charge meanwhile
// (their releases add it as they settle).
var movedTurnSQL = `(SELECT me.tag FROM me) - ` + overrunSQL("seat_turns") + ` + (SELECT ch.c FROM ch) * interval '1 microsecond'`

// aheadSQL says whether place a goes before call me in the line: more urgent, then standing
// sooner (lineTagSQL), then come sooner, then by worker. While a place of a binary of schema 19
// or before (slot_turns NULL) stands in the line (older true), every place is compared as those
// binaries compare them, from the columns they keep (oldLineTurnSQL: turn and since are still
// theirs), so that the whole fleet keeps one order: compared by slot time among themselves and
// by that rule against the older binary's places, three places could each rank another first,
// and a free seat stand idle.
func aheadSQL(a, me, older string) string {
	return `CASE WHEN NOT ` + older + ` THEN
		(` + a + `.urgency, ` + lineTagSQL(a+".key", a+".urgency") + `, coalesce(` + a + `.came, ` + a + `.since), ` + a + `.worker) <
		(` + me + `.urgency, ` + me + `.tag, ` + me + `.came, ` + me + `.worker)
	ELSE (` + a + `.urgency, ` + oldLineTurnSQL(a) + `, coalesce(` + a + `.came, ` + a + `.since), ` + a + `.worker) <
		(` + me + `.urgency, ` + oldLineTurnSQL(me) + `, ` + me + `.came, ` + me + `.worker) END`
}

// rawKeyTurnSQL is key expression k's turn in pool $1 as the binaries of schema 16 to 19 read it:
// its row's, the newcomers' for a key without one, NULL for no key.
func rawKeyTurnSQL(k string) string {
	return `CASE WHEN ` + k + ` IS NOT NULL THEN coalesce(
		(SELECT t.turn FROM seat_turns t WHERE t.pool = $1 AND t.key = ` + k + `),
		(SELECT t.turn FROM seat_turns t WHERE t.pool = $1 AND t.key = '` + store.SeatNewcomers + `')) END`
}

// freeSeatSQL is the common table expressions that give seat $2 of pool $1 back (freed, its
// row) and correct its key's turn, and the newcomers' when it was taken in their turn, to the
// slot time it held: moved on by what it held past its charge, or back by what it held less,
// never back past its band's virtual time. The key's hold becomes the time it held, and the
// pool's average moves an eighth of the way to it. Under the pool's lock, as a look's writes to
// the turns are.
var freeSeatSQL = `freed AS (DELETE FROM seats WHERE pool = $1 AND seat = $2 RETURNING key, taken_at, charged, per, newcomer, band),
	run AS (SELECT key, newcomer, band, held, floor(held / per)::bigint - charged AS delta FROM (
		SELECT key, coalesce(newcomer, false) AS newcomer, band, charged, per,
			greatest(floor(extract(epoch FROM clock_timestamp() - taken_at) * 1000000), 0)::bigint AS held
		FROM freed WHERE key IS NOT NULL AND taken_at IS NOT NULL AND per > 0 AND charged IS NOT NULL) f),
	fix AS (UPDATE seat_turns t SET vturn = CASE WHEN t.vturn IS NULL THEN NULL WHEN r.delta >= 0 THEN t.vturn + r.delta * interval '1 microsecond'
			ELSE greatest(t.vturn + r.delta * interval '1 microsecond', least(t.vturn,
				(SELECT v.vturn FROM seat_turns v WHERE v.pool = $1 AND v.key = ` + vtimeKeySQL("r.band") + `))) END,
		hold = CASE WHEN t.key = r.key THEN r.held ELSE t.hold END, seen = clock_timestamp()
		FROM run r WHERE t.pool = $1 AND (t.key = r.key OR r.newcomer AND t.key = '` + store.SeatNewcomers + `')),
	average AS (INSERT INTO seat_turns (pool, key, turn, hold, seen) SELECT $1, '` + seatAverage + `', clock_timestamp(), held, clock_timestamp() FROM run
		ON CONFLICT (pool, key) DO UPDATE SET turn = EXCLUDED.turn, seen = EXCLUDED.seen,
			hold = (coalesce(seat_turns.hold, EXCLUDED.hold) * 7 + EXCLUDED.hold) / 8)`

// lookAt is the setting, local to a look's transaction, that holds when the look began, on the
// database's clock, before it waited for the pool's lock: a call's wait is told as of then
// (cameSQL), so the time a look spends waiting for the lock does not make its call look younger
// than a call whose look did not wait.
const lookAt = "mulligan.look_at"

// cameSQL is when a call that has waited waited (microseconds) came, on the database's clock:
// reckoned from when its look began (lookAt).
func cameSQL(waited string) string {
	return `current_setting('` + lookAt + `')::timestamptz - ` + waited + ` * interval '1 microsecond'`
}

// placeSinceSQL is a place's since as it is stood in line, for the binaries of schema 19 and
// before: when its call came, or its key's turn as they read it (key: NULL for none) if later.
// A schema 15 replica ranks places by since alone; those of 16 to 19 read the turns again as
// they compare (oldLineTurnSQL). This release ranks its own places by lineTagSQL.
func placeSinceSQL(waited, key string) string {
	return `greatest(` + cameSQL(waited) + `, ` + rawKeyTurnSQL(key+`::text`) + `)`
}

// oldLineTurnSQL is when the binaries of schema 16 to 19 count the call of a place in line (alias
// x, in pool $1) as waiting from: its since, or its key's turn if later.
func oldLineTurnSQL(x string) string {
	return `greatest(` + x + `.since, ` + rawKeyTurnSQL(x+`.key`) + `)`
}

// SeatTurnsAgo returns how long ago each of keys' turns in slot time for seats of pool came, on
// the database's clock, less than none when it is still to come (see store.SeatTurns).
func (s *Store) SeatTurnsAgo(pool string, keys []string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	if len(keys) == 0 {
		return out, nil
	}
	texts := make([]string, len(keys))
	for i, k := range keys {
		texts[i] = store.LaneText(k)
	}
	err := s.query(func(ctx context.Context, db querier) error {
		clear(out)
		var read pgx.Batch // one round trip, an implicit transaction, as a look's
		read.Queue(setSeatsAt)
		read.Queue(`SELECT t.key, floor(extract(epoch FROM `+seatsAt+` - (`+turnNowSQL("t")+`)) * 1000000)::bigint
			FROM seat_turns t WHERE t.pool = $1 AND t.key = ANY($2) AND t.vturn IS NOT NULL`, pool, texts).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var k string
				var us int64
				if err := rows.Scan(&k, &us); err != nil {
					return err
				}
				out[k] = time.Duration(us) * time.Microsecond
			}
			return rows.Err()
		})
		return s.pool.SendBatch(ctx, &read).Close()
	})
	return out, err
}

// The Store keeps the fleet's turns for shared seats.
var _ store.SeatTurns = (*Store)(nil)

// placeInLine completes an insert of a worker's place in a pool's line: a worker has one place,
// which each of its looks moves to its latest call waiting.
const placeInLine = `
	ON CONFLICT (pool, worker) DO UPDATE SET urgency = EXCLUDED.urgency, seat_limit = EXCLUDED.seat_limit,
		since = EXCLUDED.since, came = EXCLUDED.came, until = EXCLUDED.until, key = EXCLUDED.key,
		waiting = EXCLUDED.waiting, slot_turns = EXCLUDED.slot_turns`

// lineUrgency is w's urgency in the fleet's line: aged by its wait as the queue ages it
// (store.EffectiveUrgency).
func lineUrgency(w store.SeatWaiter) int {
	return store.EffectiveUrgency(store.ClampUrgency(w.Urgency), w.Waited)
}

// WithdrawWaiter takes worker's call out of pool's order (see store.SharedSeats).
func (s *Store) WithdrawWaiter(pool, worker string) error {
	return s.query(func(ctx context.Context, db querier) error {
		_, err := db.Exec(ctx, `DELETE FROM seat_waiters WHERE pool = $1 AND worker = $2`, pool, worker)
		return err
	})
}

// SeatsHeld counts pool's live seats, held by any replica (see store.SharedSeats).
func (s *Store) SeatsHeld(pool string) (int, error) {
	var n int
	err := s.query(func(ctx context.Context, db querier) error {
		return db.QueryRow(ctx, `SELECT count(*) FROM seats WHERE pool = $1 AND `+seatLive, pool).Scan(&n)
	})
	return n, err
}

// ReleaseSeat gives seat of pool back (see store.SharedSeats), and has the replicas told when a
// call of theirs stands in the pool's line.
func (s *Store) ReleaseSeat(pool, seat string) error {
	return s.query(func(ctx context.Context, db querier) error {
		waited := false
		var release pgx.Batch // one round trip, an implicit transaction, as a look's
		release.Queue(`SELECT set_config('lock_timeout', $1, true), `+genericPlans, lookLockTimeout(s.opts.Timeout))
		release.Queue(`SELECT pg_advisory_xact_lock($1, hashtext($2))`, seatLockClass, pool)
		release.Queue(`WITH `+freeSeatSQL+`
			SELECT EXISTS (SELECT 1 FROM freed) AND EXISTS (SELECT 1 FROM seat_waiters WHERE pool = $1 AND `+waiterLive+`)`,
			pool, seat).QueryRow(func(row pgx.Row) error { return row.Scan(&waited) })
		err := s.pool.SendBatch(ctx, &release).Close()
		if err == nil && waited {
			s.seats.note(pool)
		}
		return err
	})
}

// RenewSeats extends by lease those of seats that worker holds in pool and that are still live,
// and returns them (see store.SharedSeats). A seat that already lapsed is not revived: another
// replica may have taken its place.
func (s *Store) RenewSeats(pool, worker string, seats []string, lease time.Duration) ([]string, error) {
	var renewed []string
	err := s.query(func(ctx context.Context, db querier) error {
		rows, err := db.Query(ctx, `UPDATE seats SET until = `+leaseEnd(4)+`
			WHERE pool = $1 AND worker = $2 AND seat = ANY($3) AND `+seatLive+` RETURNING seat`, pool, worker, seats, lease.Microseconds())
		if err != nil {
			return err
		}
		renewed, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return renewed, err
}

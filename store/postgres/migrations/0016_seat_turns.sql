-- The keys' turns for shared seats, kept for the whole fleet (docs/capacity.md, "Many replicas:
-- `shared N`"): when a key's call last took a seat of a pool, on the database's clock, and the
-- newcomers' turn under '*newcomers' (store.SeatNewcomers). A place in the fleet's line keeps
-- its call's key, and the line counts each place's wait from the later of when its call came
-- and its key's turn (the newcomers' for a key without one), as the turns are when it compares,
-- so a key served on one replica waits its turn on every other and the newcomers share one turn
-- across the fleet. The sweep forgets a turn 10 minutes after it was taken
-- (store.KeepIdleLanesFor). Additive: a binary of schema 15 never reads the table and leaves a
-- place's key NULL, which counts from its since as that binary set it (from its own turns), so
-- it runs beside this one and readable_by stays; the two rank each other's places alike but for
-- a turn taken since a place was stood in line, which its replica's next look catches up with.
CREATE TABLE seat_turns (
    pool text NOT NULL,
    key  text COLLATE "C" NOT NULL,
    turn timestamptz NOT NULL,
    PRIMARY KEY (pool, key)
);
CREATE INDEX seat_turns_turn ON seat_turns (turn);

-- A place keeps its call's key and when the call came; its since is the later of that and the
-- key's turn when it was stood in line, which is what a schema 15 replica ranks it by, as its
-- own places (theirs have neither column: their since is their own turns').
ALTER TABLE seat_waiters ADD COLUMN key text COLLATE "C"; -- NULL: no turn counted
ALTER TABLE seat_waiters ADD COLUMN came timestamptz;     -- NULL: since

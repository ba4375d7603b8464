-- The fleet's line for shared seats in slot time (docs/capacity.md, "Many replicas: `shared
-- N`"), start-time fair queuing as the durable queue's order is: a seat taken moves its key's
-- turn on by the slot time the key's seats held lately (seat_turns.hold, microseconds; a key
-- never measured is charged the pool's average, the row '*average'), over the pool's seats times
-- the key's weight; a seat held past its charge counts in its key's turn while it is held; its
-- release corrects the turn to the time it held. Each band keeps a virtual time (the rows
-- '*vtime:<band>'), where its latest call taken stood in line; a call stands at the later of its
-- key's turn and its band's virtual time. Turns are thus no longer times of the clock, and the
-- sweep forgets a row by when it was last written (seen). A seat keeps what its release needs:
-- its key, when it was taken, the charge (microseconds of turn), what the charge was divided by
-- (per), whether it was taken in the newcomers' turn, and its band. A place in line of this
-- release says so (slot_turns): the line compares a place of a binary of schema 19 or before
-- as that binary does. Additive: such a binary leaves the new columns NULL, sets a turn to the
-- time of its take, and runs beside this one (readable_by stays); a seat it took counts no
-- overrun and its release corrects nothing.
ALTER TABLE seat_turns ADD COLUMN hold bigint;
ALTER TABLE seat_turns ADD COLUMN seen timestamptz;
ALTER TABLE seats ADD COLUMN key text COLLATE "C";
ALTER TABLE seats ADD COLUMN taken_at timestamptz;
ALTER TABLE seats ADD COLUMN charged bigint;
ALTER TABLE seats ADD COLUMN per double precision;
ALTER TABLE seats ADD COLUMN newcomer boolean;
ALTER TABLE seats ADD COLUMN band int;
ALTER TABLE seat_waiters ADD COLUMN slot_turns boolean;
-- No index on when a row was last written: every seat taken and released writes its key's row,
-- the pool's average and its band's virtual time, and an index on what they change would make
-- each write add an entry to every index of the table (no heap-only update). The sweep reads
-- the table whole once a minute instead.
DROP INDEX seat_turns_turn;

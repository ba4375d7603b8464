-- Turns in slot time in the durable queue (docs/backends.md, "The capacity order"): a lane's
-- turn is the virtual start of its next claim (vturn, microseconds of slot time), which a claim
-- moves on by the slot time the lane's runs took lately (hold) over its weight, and the end of
-- the run corrects to the time it ran (store.LaneStart, store.SettledTurn). The virtual time,
-- the start of the latest claim, and the queue's average run are kept in the row
-- '*newcomers:vtime' (vturn, hold), beside the newcomers' rows of each band (whose vturn is
-- their turn in slot time), so a sweep of schema 11 and later keeps it. The claim records what it
-- charged in the operation's document (store.Operation.Charged).
--
-- Additive: a binary of schema 17 never reads the new columns and keeps writing turn and credit,
-- which this one writes too, so each orders the lanes by its own turns and runs beside the other
-- (readable_by stays). A lane only a schema 17 replica claimed has no vturn, and waits with the
-- newcomers here until this release claims it.
ALTER TABLE queue_lanes ADD COLUMN vturn bigint; -- NULL: no turn in slot time
ALTER TABLE queue_lanes ADD COLUMN hold bigint;  -- NULL: no run measured
INSERT INTO queue_lanes (lane, turn, vturn) VALUES ('*newcomers:vtime', 0, 0) ON CONFLICT (lane) DO NOTHING;

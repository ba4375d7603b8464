-- Turns in slot time in the durable queue (docs/backends.md, "The capacity order"): a lane's
-- turn in a band is the virtual start of its next claim there (vturns[band + 1], microseconds of
-- slot time; the rows of the newcomers and of the bands keep theirs in vturn), which a claim
-- moves on by the slot time the lane's runs are expected to hold (hold: their moving average,
-- or the queue's) over its weight; a running operation's time past that counts as it runs, and
-- the end of its run charges the time it ran (store.LaneStart, store.SettledTurn). Each band's
-- virtual time, the newcomers' corrections and the queue's average are kept in rows named
-- '*newcomers:vtime:<band>', '*newcomers:debt:<band>' and '*newcomers:average', which a start
-- and every sweep make when missing (ensureNewcomers) and no sweep deletes. What a claim charged
-- is kept in the operation's document (store.Operation.Charged) and, while it runs, in its row.
--
-- Additive: a binary of schema 17 never reads the new columns and rows and keeps writing turn
-- and credit, which this one writes too, so each orders the lanes by its own turns and runs
-- beside the other (readable_by stays). A lane only a schema 17 replica claimed has no vturns,
-- and waits with the newcomers here until this release claims it.
ALTER TABLE queue_lanes ADD COLUMN vturns bigint[]; -- a lane's, by band; NULL: no turn in slot time
ALTER TABLE queue_lanes ADD COLUMN vturn bigint;    -- the newcomers' and the bands' rows'
ALTER TABLE queue_lanes ADD COLUMN hold bigint;     -- NULL: no run measured

-- A claimed operation's run, as its claim wrote it (runsSQL): counted while the same worker holds
-- it. A schema 17 binary never writes them; its claims count nothing while they run.
ALTER TABLE operations ADD COLUMN run_holder text;
ALTER TABLE operations ADD COLUMN run_started_at timestamptz;
ALTER TABLE operations ADD COLUMN run_charged bigint;
ALTER TABLE operations ADD COLUMN run_band int;
ALTER TABLE operations ADD COLUMN run_newcomer bool;
ALTER TABLE operations ADD COLUMN run_nc_charged bigint;

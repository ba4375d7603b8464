-- A caller's own urgency within its lane (docs/backends.md, "The capacity order"): lift is how
-- many levels more urgent than urgency the caller asked for its own work (store.Operation.Lift),
-- which orders the work of its lane and never its place against other lanes. Additive: a binary
-- of schema 13 leaves it 0 (the default, the same as before) and claims a lane's work oldest
-- first, so it runs beside this one and readable_by stays. A constant default adds the column
-- without rewriting the table.

ALTER TABLE operations ADD COLUMN lift smallint NOT NULL DEFAULT 0;

-- The claim's index by lane and lift is built by migration 15, CONCURRENTLY.

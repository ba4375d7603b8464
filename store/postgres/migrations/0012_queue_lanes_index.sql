-- mulligan:no-transaction
-- The capacity order's index by lane (migration 11), built CONCURRENTLY outside a transaction,
-- as migration 6 builds the one by scope. The claim walks the head of each (lane, urgency)
-- group; the included columns let it decide without reading the rows (lane and scope too: the
-- planner reads an expression's columns from the index only when they are in it).
-- operations_queued_order stays for binaries of schema 10, which walk by scope.
DROP INDEX CONCURRENTLY IF EXISTS operations_queued_lane;
CREATE INDEX CONCURRENTLY operations_queued_lane ON operations ((coalesce(lane, scope)), urgency, id)
    INCLUDE (submitted_at, queue_deadline, lane, scope) WHERE status = 'queued';
-- The sweep forgets the turns of lanes left without queued or running work: a fairness key's
-- active operations, found by their lane (a scope's by operations_active).
DROP INDEX CONCURRENTLY IF EXISTS operations_active_lane;
CREATE INDEX CONCURRENTLY operations_active_lane ON operations (lane)
    WHERE status IN ('queued', 'running') AND lane IS NOT NULL;

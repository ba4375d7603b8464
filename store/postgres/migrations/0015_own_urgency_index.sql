-- mulligan:no-transaction
-- The capacity order's index by lane, urgency and lift (migration 14), built CONCURRENTLY
-- outside a transaction, as migration 12 builds the one by lane. The claim walks the head of
-- each (lane, urgency, lift) group, the oldest of the group, and picks within a lane by its own
-- urgency; the included columns let it decide without reading the rows. operations_queued_lane
-- stays for binaries of schemas 11 to 14, which walk by (lane, urgency).
DROP INDEX CONCURRENTLY IF EXISTS operations_queued_own;
CREATE INDEX CONCURRENTLY operations_queued_own ON operations ((coalesce(lane, scope)), urgency, lift, id)
    INCLUDE (submitted_at, queue_deadline, lane, scope) WHERE status = 'queued';

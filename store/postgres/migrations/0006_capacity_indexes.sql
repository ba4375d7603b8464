-- mulligan:no-transaction
-- The capacity order's indexes (migration 5, docs/backends.md "The capacity order"), built
-- CONCURRENTLY outside a transaction: a large operations table keeps taking writes while they
-- are built. A build cut off part-way leaves an invalid index, which the run after drops and
-- builds again.
--
-- The claim walks the head of each (scope, urgency) group (a loose index scan), never the whole
-- queue; the included columns let it decide without reading the rows.
DROP INDEX CONCURRENTLY IF EXISTS operations_queued_order;
CREATE INDEX CONCURRENTLY operations_queued_order ON operations (scope, urgency, id) INCLUDE (submitted_at, queue_deadline)
    WHERE status = 'queued';
DROP INDEX CONCURRENTLY IF EXISTS operations_queued_deadline;
CREATE INDEX CONCURRENTLY operations_queued_deadline ON operations (queue_deadline)
    WHERE status = 'queued' AND queue_deadline IS NOT NULL;

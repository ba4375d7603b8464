-- mulligan:no-transaction
-- A page of one status (GET {operations}?status=running) walks the scope's operations of that
-- status newest first, instead of the scope's whole history (docs/backends.md). Built
-- CONCURRENTLY, outside a transaction: a large table keeps taking writes while it is built. A
-- build cut off part-way leaves an invalid index, which the run after drops and builds again.
DROP INDEX CONCURRENTLY IF EXISTS operations_scope_status;
CREATE INDEX CONCURRENTLY operations_scope_status ON operations (scope, status, id);

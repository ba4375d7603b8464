-- A page of one status (GET {operations}?status=running) walks the scope's operations of that
-- status newest first, instead of the scope's whole history (docs/backends.md).
CREATE INDEX operations_scope_status ON operations (scope, status, id);

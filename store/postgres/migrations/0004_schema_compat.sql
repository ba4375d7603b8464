-- The oldest binary schema this database's data stays readable by (docs/backends.md, "Rolling
-- upgrades"). Every binary checks it at start: one whose newest schema is below readable_by
-- refuses to run. A migration is additive (expand now, contract in a later release); one that
-- a binary of the previous schema can no longer work beside raises readable_by in the same file.
-- Binaries of schema 3 work beside this one: 4 adds only this table (and 5, capacity, only adds).
CREATE TABLE schema_compat (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    readable_by integer NOT NULL
);
INSERT INTO schema_compat (readable_by) VALUES (3);

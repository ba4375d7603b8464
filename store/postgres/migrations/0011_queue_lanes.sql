-- Fairness keys in the durable queue (docs/backends.md, "The capacity order"): queued operations
-- take turns by lane, their fairness key (capacity fair_key) or, without one, their scope, and a
-- lane of weight w takes w claims per turn. Additive only: a binary of schema 10 leaves lane NULL
-- (read as the scope) and its claims take turns by scope, so it runs beside this one and
-- readable_by stays.

ALTER TABLE operations ADD COLUMN lane text COLLATE "C"; -- NULL: the scope
ALTER TABLE operations ADD COLUMN weight real;           -- NULL: 1

-- queue_turns.scope now holds lanes (a scope is a lane); credit counts a weighted lane's claims
-- since its turn last moved on (store.ClaimTurn).
ALTER TABLE queue_turns ADD COLUMN credit double precision NOT NULL DEFAULT 0;

-- The claim's index by lane is built by migration 12, CONCURRENTLY.

-- Fairness keys in the durable queue (docs/backends.md, "The capacity order"): queued operations
-- take turns by lane, their fairness key (capacity fair_key) or, without one, their scope, and a
-- lane of weight w takes w claims per turn. Additive only: a binary of schema 10 leaves lane NULL
-- (read as the scope), keeps its own turns by scope in queue_turns and never reads queue_lanes,
-- so it runs beside this one and readable_by stays.

ALTER TABLE operations ADD COLUMN lane text COLLATE "C"; -- NULL: the scope
ALTER TABLE operations ADD COLUMN weight real;           -- NULL: 1

-- Each lane's turn: the value of queue_turn_seq at the claim that last moved it on, the claims
-- taken since (credit), and the weight of its latest claim (store.ClaimTurn). A table of its own:
-- a schema 10 replica's sweep forgets every queue_turns row whose scope has no work, which
-- would be every fairness key's.
CREATE TABLE queue_lanes (
    lane   text COLLATE "C" PRIMARY KEY,
    turn   bigint NOT NULL,
    credit double precision NOT NULL DEFAULT 0,
    weight real NOT NULL DEFAULT 1
);

-- The claim's index by lane is built by migration 12, CONCURRENTLY.

-- Capacity (docs/backends.md, "The capacity order"): queued operations are claimed by effective
-- urgency, then the scopes take turns, then oldest first; `shared N` seats are held by replicas.
-- Additive only: adding a column with a constant default rewrites nothing, and an operation
-- written by an older replica (without these columns) waits at urgency 3, as its document reads.

ALTER TABLE operations ADD COLUMN urgency smallint NOT NULL DEFAULT 3;
ALTER TABLE operations ADD COLUMN submitted_at timestamptz;   -- waiting counts from then (NULL: no wait counted)
ALTER TABLE operations ADD COLUMN queue_deadline timestamptz; -- a queued operation past it is stale

-- Operations that may still wait again (queued, or running and perhaps requeued) get their
-- submission time from their document.
UPDATE operations SET submitted_at = (convert_from(doc, 'UTF8')::jsonb ->> 'submitted_at')::timestamptz
    WHERE status IN ('queued', 'running');

-- The claim's indexes are built by migration 6, CONCURRENTLY.

-- Each scope's turn: the value of queue_turn_seq at its latest claim. The scope served least
-- recently goes first; a scope without a row (never served, or forgotten by the sweep once it
-- had no work left) goes before all.
CREATE SEQUENCE queue_turn_seq;
CREATE TABLE queue_turns (
    scope text COLLATE "C" PRIMARY KEY,
    turn  bigint NOT NULL
);

-- Seats shared by replicas (capacity `shared N`): a row is a seat held by worker until `until`;
-- a seat whose holder stopped renewing lapses and no longer counts.
CREATE TABLE seats (
    pool   text NOT NULL,
    seat   text NOT NULL,
    worker text NOT NULL,
    until  timestamptz NOT NULL,
    PRIMARY KEY (pool, seat)
);
CREATE INDEX seats_worker ON seats (pool, worker);

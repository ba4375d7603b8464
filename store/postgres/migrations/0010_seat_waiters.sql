-- The fleet's order for shared seats (docs/capacity.md, "Many replicas: `shared N`"): each
-- replica with calls waiting for a pool's shared seats keeps one row here, for its most urgent
-- then longest-waiting call, refreshed by each look and timed on the database's clock. A seat
-- that comes free goes to the best rows first. A binary of schema 9 never reads the table and
-- takes free seats as it finds them, so it runs beside this one: readable_by stays.
CREATE TABLE seat_waiters (
    pool    text NOT NULL,
    worker  text NOT NULL,
    urgency smallint NOT NULL,    -- aged as the queue ages it (store.EffectiveUrgency)
    seat_limit integer NOT NULL,  -- the replica's `shared N`: it can take a seat only while fewer are held
    since   timestamptz NOT NULL, -- when its call came, on the database's clock
    until   timestamptz NOT NULL, -- forgotten after, should its replica stop looking
    PRIMARY KEY (pool, worker)
);

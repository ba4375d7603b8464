-- Recorded event streams (docs/streams.md): a keyed Server-Sent Events answer is stored event by
-- event while it is relayed, so a duplicate on any replica can join it, resume it by
-- Last-Event-ID, or replay it once finished.

-- A completed key whose answer is a recorded stream (its events are in stream_segments, and
-- response_body stays empty) keeps the revision it was completed at. The record replays the
-- stream only while the row is still at that revision: any later write to the row, by any
-- version of the gateway, bumps rev and so unbinds the stream from it. Adding a column without
-- a default rewrites nothing.
ALTER TABLE idempotency_keys ADD COLUMN streamed_rev bigint;

-- The stream of a key's current attempt (token: the claim it records). A new attempt replaces
-- the row and deletes the previous attempt's events.
CREATE TABLE stream_heads (
    key        bytea PRIMARY KEY,
    token      text NOT NULL,
    state      smallint NOT NULL,                -- store.StreamState: 1 live, 2 finished, 3 aborted
    status     integer NOT NULL,
    header     bytea,                            -- as store.EncodeHeader writes it
    events     bigint NOT NULL DEFAULT 0,
    bytes      bigint NOT NULL DEFAULT 0,
    keep_until timestamptz NOT NULL              -- the events' expiry: the sweep deletes them then
);
CREATE INDEX stream_heads_keep ON stream_heads (keep_until);

-- The events, one row per batch appended (a segment: each event's id and data, length-prefixed,
-- as store.EncodeSegment writes them), holding the events first_seq..last_seq. Stored out of
-- line and uncompressed: a segment is written once and read by position.
CREATE TABLE stream_segments (
    key       bytea NOT NULL,
    token     text NOT NULL,
    first_seq bigint NOT NULL,
    last_seq  bigint NOT NULL,
    data      bytea NOT NULL,
    PRIMARY KEY (key, token, first_seq)
);
ALTER TABLE stream_segments ALTER COLUMN data SET STORAGE EXTERNAL;

-- The position of each event the upstream named itself (an id other than its position), kept
-- as bytes: an upstream's id need not be UTF-8. An id the stream repeats is kept at seq 0
-- (ambiguous: no Last-Event-ID resumes after it; older binaries kept the first).
CREATE TABLE stream_ids (
    key   bytea NOT NULL,
    token text NOT NULL,
    id    bytea NOT NULL,
    seq   bigint NOT NULL,
    PRIMARY KEY (key, token, id)
);

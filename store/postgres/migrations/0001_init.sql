-- Mulligan's schema, version 1 (docs/backends.md). Ids are compared byte-wise (COLLATE "C"):
-- operation ids sort by creation time, and the queue and the lists rely on that order.
-- Documents (doc) are the JSON of store's types, kept as bytes so they read back exactly; the
-- columns beside them are what queries filter on, and where they differ the column is the truth
-- (leases are renewed, due times rescheduled, without rewriting the document).

CREATE TABLE idempotency_keys (
    key             bytea PRIMARY KEY,
    rev             bigint NOT NULL DEFAULT 1,   -- bumped by every write: a claim is taken only from the row it was decided on
    fingerprint     bytea NOT NULL,
    state           smallint NOT NULL,           -- store.RecordState: 1 in flight, 2 completed
    token           text NOT NULL DEFAULT '',
    claimed_at      timestamptz NOT NULL,
    lease_until     timestamptz,
    expires_at      timestamptz,                 -- end of the replay window
    purge_at        timestamptz NOT NULL,        -- from then on the record reads as absent; the sweep deletes it
    operation_id    text COLLATE "C",
    response_status integer,
    response_header bytea,
    response_body   bytea
);
CREATE INDEX idempotency_keys_purge ON idempotency_keys (purge_at);

CREATE TABLE operations (
    id                  text COLLATE "C" PRIMARY KEY,
    scope               text COLLATE "C" NOT NULL,
    status              text NOT NULL,
    holder              text,
    lease_until         timestamptz,
    cancel_requested_at timestamptz,
    expires_at          timestamptz,             -- end of a final operation's retention: it reads as expired
    purge_at            timestamptz,             -- the tombstone is gone
    doc                 bytea NOT NULL
);
CREATE INDEX operations_scope ON operations (scope, id);
CREATE INDEX operations_queued ON operations (id) WHERE status = 'queued';
CREATE INDEX operations_running ON operations (lease_until) WHERE status = 'running';
CREATE INDEX operations_active ON operations (scope) WHERE status IN ('queued', 'running');
CREATE INDEX operations_purge ON operations (purge_at) WHERE purge_at IS NOT NULL;

CREATE TABLE operation_requests (
    op_id text COLLATE "C" PRIMARY KEY,
    doc   bytea NOT NULL,
    body  bytea NOT NULL
);

CREATE TABLE operation_results (
    op_id      text COLLATE "C" PRIMARY KEY,
    status     integer NOT NULL,
    header     bytea,
    body       bytea NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX operation_results_expires ON operation_results (expires_at);

CREATE TABLE events (
    id           text COLLATE "C" PRIMARY KEY,
    state        text NOT NULL,                  -- pending, delivered, dead
    endpoint     text NOT NULL,
    next_attempt timestamptz,
    holder       text,                           -- the worker delivering it, until lease_until
    lease_until  timestamptz,
    dead_at      timestamptz,
    purge_at     timestamptz,                    -- a delivered event is gone
    doc          bytea NOT NULL
);
CREATE INDEX events_due ON events (next_attempt, id) WHERE state = 'pending';
CREATE INDEX events_endpoint ON events (endpoint) WHERE state = 'pending';
CREATE INDEX events_dead ON events (id) WHERE state = 'dead';
CREATE INDEX events_purge ON events (purge_at) WHERE purge_at IS NOT NULL;

CREATE TABLE endpoint_states (
    name text PRIMARY KEY,
    doc  bytea NOT NULL
);

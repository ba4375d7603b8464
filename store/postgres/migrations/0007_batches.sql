-- Files and batches (docs/batches.md). Additive: new tables only.
-- A file's row is written first (complete = false) and its chunks after it, so a file half
-- uploaded when its replica died is never listed and goes with its row at expires_at.

CREATE TABLE files (
    id         text COLLATE "C" PRIMARY KEY,
    scope      text COLLATE "C" NOT NULL,
    complete   boolean NOT NULL DEFAULT false,
    expires_at timestamptz NOT NULL,
    doc        bytea NOT NULL
);
CREATE INDEX files_scope ON files (scope, id) WHERE complete;
CREATE INDEX files_expires ON files (expires_at);

CREATE TABLE file_chunks (
    file_id text COLLATE "C" NOT NULL REFERENCES files (id) ON DELETE CASCADE,
    seq     integer NOT NULL,
    data    bytea NOT NULL,
    PRIMARY KEY (file_id, seq)
);

CREATE TABLE batches (
    id       text COLLATE "C" PRIMARY KEY,
    scope    text COLLATE "C" NOT NULL,
    status   text NOT NULL,
    purge_at timestamptz,                      -- set when final: the batch is gone then
    doc      bytea NOT NULL
);
CREATE INDEX batches_scope ON batches (scope, id);
CREATE INDEX batches_unsettled ON batches (id) WHERE purge_at IS NULL;
CREATE INDEX batches_purge ON batches (purge_at) WHERE purge_at IS NOT NULL;

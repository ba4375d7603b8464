-- One stream model (docs/streams.md): an operation's streamed answer is recorded as a stream of
-- its own, named by the operation's id and fenced by the worker running it, where schema 7's
-- binaries borrowed an idempotency key (mulligan/operation-stream/<id>) to fence it. On such a
-- stream's head, operation_id names the operation and holder the worker; both stay NULL on a
-- keyed stream, fenced by its key's claim as before. Nullable columns without a default rewrite
-- nothing, and a binary of schema 7 never reads or writes them: readable_by stays as it is.
ALTER TABLE stream_heads ADD COLUMN operation_id text, ADD COLUMN holder text;

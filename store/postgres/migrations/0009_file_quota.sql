-- A scope's stored files are bounded (docs/batches.md, "Scope and retention"): each files row
-- keeps the bytes stored so far, written with each chunk, so an upload counts against its
-- scope's quota from its first chunk and the quota sums one row per file. Rows stored before
-- this migration are sized from their chunks. A binary of schema 8 never reads the column and
-- inserts its rows at 0 bytes (the default), so it runs beside this one: readable_by stays.
ALTER TABLE files ADD COLUMN bytes bigint NOT NULL DEFAULT 0;
UPDATE files SET bytes = (SELECT coalesce(sum(octet_length(data)), 0) FROM file_chunks WHERE file_id = files.id);
CREATE INDEX files_quota ON files (scope, expires_at);

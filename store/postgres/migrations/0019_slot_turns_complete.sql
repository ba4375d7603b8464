-- Completes schema 18 on a database that an earlier build of it migrated: 0018 gained columns
-- while it was being written, before any release, and a database migrated by one of those
-- builds lacks them (every claim then failed: column does not exist). IF NOT EXISTS, so on a
-- database that 0018 migrated as it stands this adds nothing. It also forgets the row of one
-- virtual time for every band that the first of those builds made ('*newcomers:vtime'; the
-- bands' own are '*newcomers:vtime:<band>'), which nothing reads. Additive: readable_by stays.
ALTER TABLE queue_lanes ADD COLUMN IF NOT EXISTS vturns bigint[];
ALTER TABLE queue_lanes ADD COLUMN IF NOT EXISTS vturn bigint;
ALTER TABLE queue_lanes ADD COLUMN IF NOT EXISTS hold bigint;
ALTER TABLE operations ADD COLUMN IF NOT EXISTS run_holder text;
ALTER TABLE operations ADD COLUMN IF NOT EXISTS run_started_at timestamptz;
ALTER TABLE operations ADD COLUMN IF NOT EXISTS run_charged bigint;
ALTER TABLE operations ADD COLUMN IF NOT EXISTS run_band int;
ALTER TABLE operations ADD COLUMN IF NOT EXISTS run_newcomer bool;
ALTER TABLE operations ADD COLUMN IF NOT EXISTS run_nc_charged bigint;
DELETE FROM queue_lanes WHERE lane = '*newcomers:vtime';

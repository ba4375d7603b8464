-- How many calls each replica has waiting for a seat of the pool, by urgency (docs/capacity.md,
-- "Many replicas: `shared N`"): a place in the fleet's line is one replica's best call, and
-- keeps the replica's counts as of its latest look, so that every replica can show the fleet's
-- waiters (/mulligan/stats, mulligan_capacity_shared_fleet_waiting). Additive: a binary of
-- schema 16 leaves it NULL, and such a place counts as one call at its urgency.
ALTER TABLE seat_waiters ADD COLUMN waiting int[];

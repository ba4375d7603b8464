-- A lane left without queued or running work keeps its turn for a while (docs/backends.md, "The
-- capacity order"): the sweep notes when it first finds the lane so (idle_since), and forgets its
-- turn once that is store.KeepIdleLanesFor old; a claim of the lane clears the note. Additive: a
-- binary of schema 12 never reads it (its sweep forgets an idle lane's turn by the turn's age, or
-- at once before this wave), so it runs beside this one and readable_by stays.

ALTER TABLE queue_lanes ADD COLUMN idle_since timestamptz;

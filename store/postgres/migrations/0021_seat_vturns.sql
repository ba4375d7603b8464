-- The fleet's turns for shared seats in slot time move to a column of their own (vturn), and
-- turn keeps what a binary of schema 19 reads and writes there: when the key's call last took a
-- seat, on the database's clock. Turns in slot time fall behind the clock under load (the
-- virtual time moves as the seats' time over the keys sharing them), so kept in turn they made
-- a schema 19 replica's sweep forget the rows of keys in use, ranked that binary's places first
-- come, first served, and a seat it took moved its key's turn hours ahead. Additive: readable_by
-- stays.
ALTER TABLE seat_turns ADD COLUMN vturn timestamptz;

-- Each state of a lease keeps its own index, holding only the rows in that state (issue 35).
--
-- `deliveries_waiting` (subscription_id, state, offset) held every row, settled ones too: a
-- message handed out at once was entered as 'acquired' and, when settled, moved to 'done' —
-- an index delete and insert on the hot path for an entry no query reads ('done' rows are
-- found by offset, by the purge and the consumed check). Now:
--
--   waiting   — 'available' rows, by subscription and offset (what a fetch hands out next);
--   acquired  — 'acquired' rows, by subscription and deadline (lapses, wakes, in-flight
--               counts); it was a global index by deadline: the two statements that asked
--               every subscription at once now ask each subscription in turn;
--   dead      — dead letters, by subscription and offset.
--
-- A message handed out at once and accepted touches only `acquired` (and the table, its key
-- and `deliveries_offset`). `state` stays a key column although each index holds one value
-- of it: with two equality terms (subscription_id, state) the planner prefers these indexes
-- over the primary key's subscription_id prefix, which would walk settled rows too. For the
-- same reason `deliveries_group_acquired` gains it: without it, "is any message of this group
-- leased?" would tie with `deliveries_acquired` and might walk a subscription's every lease.
DROP INDEX deliveries_waiting;
DROP INDEX deliveries_acquired;
DROP INDEX deliveries_group_acquired;
CREATE INDEX deliveries_waiting ON deliveries (subscription_id, state, offset)
    WHERE state = 'available';
CREATE INDEX deliveries_acquired ON deliveries (subscription_id, state, due)
    WHERE state = 'acquired';
CREATE INDEX deliveries_dead ON deliveries (subscription_id, state, offset)
    WHERE state = 'dead';
CREATE INDEX deliveries_group_acquired ON deliveries (subscription_id, group_key, state)
    WHERE state = 'acquired' AND group_key IS NOT NULL;

-- Request-response operations (D16), second round.
-- `attempt`: which call a `calling` row belongs to. Every call (the first, or one that takes
-- over a call whose outcome became unknown) gets a new one; the call's outcome is written only
-- while the row is still that attempt's, so a call that outlived its take-over cannot
-- overwrite the answer of the call that replaced it.
ALTER TABLE exchanges ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;

-- The bytes of the answers each source's requests hold: a running total, changed with every
-- answer kept and every purge, so that the quota check before a call reads one row instead of
-- adding up every kept answer of the source.
CREATE TABLE answer_quota (
    source TEXT PRIMARY KEY,
    bytes  INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO answer_quota (source, bytes)
    SELECT source, SUM(size) FROM exchanges GROUP BY source HAVING SUM(size) > 0;
DROP INDEX exchanges_by_source;

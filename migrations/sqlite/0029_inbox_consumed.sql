-- Which inbox messages are consumed (their bytes freed for their source's quota, D13), kept
-- beside the inbox rather than in it (issue 35). Marking `inbox.consumed` rewrote the message's
-- row, and with it the page holding its payload: about 1.4 KB of WAL for every message settled
-- on top of the few bytes that say so. A row here is an offset, a hundred to a page.
--
-- `inbox.consumed` stays (dropping a column rewrites every stored payload, held in memory one
-- record at a time) but is no longer read or written: this table is the one answer. A row
-- lives as long as its inbox message; the purge deletes both.
CREATE TABLE inbox_consumed (
    offset INTEGER PRIMARY KEY
) STRICT;
INSERT INTO inbox_consumed (offset) SELECT offset FROM inbox WHERE consumed <> 0;

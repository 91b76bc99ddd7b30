-- Groups by row id, without a B-tree over (partner, group_id). Group ids are the partners'
-- random UUIDs: that index put every new group on a random page, so each commit of N
-- singletons wrote N scattered 4 KiB pages to the WAL (and the checkpoint wrote them again),
-- three quarters of what the commit wrote. New rows now land at the table's end, and the
-- writer finds a group by a keyed hash of (partner, group_id) it keeps in memory, loaded from
-- this table at start (store/sqlite/group_index.rs). Only the single writer inserts, so the
-- pair stays unique without a constraint.
CREATE TABLE groups_by_id (
    id            INTEGER PRIMARY KEY,
    partner       TEXT NOT NULL,
    group_id      TEXT NOT NULL,
    channel       TEXT NOT NULL,
    status        TEXT NOT NULL,
    next_deadline INTEGER,
    updated_at    INTEGER NOT NULL,
    state         TEXT NOT NULL,
    source        TEXT NOT NULL DEFAULT '',
    state_bin     BLOB
) STRICT;
INSERT INTO groups_by_id (partner, group_id, channel, status, next_deadline, updated_at, state,
                          source, state_bin)
    SELECT partner, group_id, channel, status, next_deadline, updated_at, state, source,
           state_bin FROM groups ORDER BY rowid;
DROP TABLE groups;
ALTER TABLE groups_by_id RENAME TO groups;
CREATE INDEX groups_next_deadline ON groups (next_deadline) WHERE next_deadline IS NOT NULL;
CREATE INDEX groups_open_by_source ON groups (source) WHERE status = 'open';

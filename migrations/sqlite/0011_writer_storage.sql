-- The fast writer (issue 14). Group state in a compact binary record (`state_bin`, written by
-- every new or changed group; `state` then holds ''), read in place of the JSON of rows written
-- before, which stay readable as they are.
ALTER TABLE groups ADD COLUMN state_bin BLOB;

-- Big payloads are written with incremental blob I/O (a zero blob filled in chunks), which
-- needs a column that keeps a BLOB (STRICT `ANY`) and, so that SQLite never builds the whole
-- value in memory, the payload as the record's last column. The inbox is rebuilt for that;
-- offsets, and the AUTOINCREMENT high-water mark (no offset is ever handed out twice), stay.
-- Readers take the payload as bytes (small ones stay TEXT).
CREATE TABLE inbox_rebuilt (
    offset      INTEGER PRIMARY KEY AUTOINCREMENT,
    channel     TEXT NOT NULL,
    topic       TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    number      INTEGER,
    namespaces  TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    expiry      INTEGER NOT NULL,
    partner     TEXT NOT NULL DEFAULT '',
    payload     ANY NOT NULL
) STRICT;
INSERT INTO inbox_rebuilt (offset, channel, topic, group_id, number, namespaces, received_at,
                           expiry, partner, payload)
    SELECT offset, channel, topic, group_id, number, namespaces, received_at, expiry, partner,
           payload FROM inbox ORDER BY offset;
DELETE FROM sqlite_sequence WHERE name = 'inbox_rebuilt';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'inbox_rebuilt', seq FROM sqlite_sequence WHERE name = 'inbox';
DROP TABLE inbox;
ALTER TABLE inbox_rebuilt RENAME TO inbox;
CREATE INDEX inbox_group ON inbox (partner, group_id, number);
CREATE INDEX inbox_received_at ON inbox (received_at);

-- Big ordered messages wait in the buffer the same way.
CREATE TABLE buffered_rebuilt (
    partner     TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    number      INTEGER NOT NULL,
    channel     TEXT NOT NULL,
    topic       TEXT NOT NULL,
    namespaces  TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    expiry      INTEGER NOT NULL,
    payload     ANY NOT NULL,
    PRIMARY KEY (partner, group_id, number)
) STRICT;
INSERT INTO buffered_rebuilt (partner, group_id, number, channel, topic, namespaces,
                              received_at, expiry, payload)
    SELECT partner, group_id, number, channel, topic, namespaces, received_at, expiry, payload
      FROM buffered;
DROP TABLE buffered;
ALTER TABLE buffered_rebuilt RENAME TO buffered;

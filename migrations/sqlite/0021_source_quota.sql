-- Storage quotas per source (issue 31, D13). Every stored message now says which source sent
-- it (`partner:{name}`, or the anonymous peer's address) and its payload's size, so that
-- `source_usage` — the bytes each source's messages take in the inbox, until consumed (settled
-- by every subscription) or purged, and in the ordered buffers — can be kept exact as messages
-- are stored, released, discarded, consumed and purged. `consumed` says an inbox message's
-- bytes were freed already (its purge frees nothing more).
--
-- The new columns must come before the payload: a big payload is written as a zero blob
-- filled in chunks, which SQLite keeps out of memory only while it is the record's last
-- column (0011). So both tables are rebuilt; offsets and the AUTOINCREMENT high-water mark
-- stay. Messages stored before this migration are counted for their partner; an anonymous
-- one's address was not kept, so it counts for no source.
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
    source      TEXT NOT NULL DEFAULT '',
    size        INTEGER NOT NULL DEFAULT 0,
    consumed    INTEGER NOT NULL DEFAULT 0,
    payload     ANY NOT NULL
) STRICT;
INSERT INTO inbox_rebuilt (offset, channel, topic, group_id, number, namespaces, received_at,
                           expiry, partner, source, size, payload)
    SELECT offset, channel, topic, group_id, number, namespaces, received_at, expiry, partner,
           CASE WHEN partner <> '' THEN 'partner:' || partner ELSE '' END,
           CASE typeof(payload) WHEN 'blob' THEN length(payload)
                ELSE length(CAST(payload AS BLOB)) END,
           payload FROM inbox ORDER BY offset;
DELETE FROM sqlite_sequence WHERE name = 'inbox_rebuilt';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'inbox_rebuilt', seq FROM sqlite_sequence WHERE name = 'inbox';
DROP TABLE inbox;
ALTER TABLE inbox_rebuilt RENAME TO inbox;
CREATE INDEX inbox_received_at ON inbox (received_at);

CREATE TABLE buffered_rebuilt (
    partner     TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    number      INTEGER NOT NULL,
    channel     TEXT NOT NULL,
    topic       TEXT NOT NULL,
    namespaces  TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    expiry      INTEGER NOT NULL,
    source      TEXT NOT NULL DEFAULT '',
    size        INTEGER NOT NULL DEFAULT 0,
    payload     ANY NOT NULL,
    PRIMARY KEY (partner, group_id, number)
) STRICT;
INSERT INTO buffered_rebuilt (partner, group_id, number, channel, topic, namespaces,
                              received_at, expiry, source, size, payload)
    SELECT b.partner, b.group_id, b.number, b.channel, b.topic, b.namespaces, b.received_at,
           b.expiry,
           coalesce((SELECT g.source FROM groups g
                     WHERE g.partner = b.partner AND g.group_id = b.group_id), ''),
           CASE typeof(b.payload) WHEN 'blob' THEN length(b.payload)
                ELSE length(CAST(b.payload AS BLOB)) END,
           b.payload FROM buffered b;
DROP TABLE buffered;
ALTER TABLE buffered_rebuilt RENAME TO buffered;

-- Bytes stored per source: written by the writer in the transaction that stores, releases or
-- discards, and by the purge in the one that deletes.
CREATE TABLE source_usage (
    source TEXT PRIMARY KEY,
    bytes  INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
INSERT INTO source_usage (source, bytes)
    SELECT source, sum(size) FROM (SELECT source, size FROM inbox
                                   UNION ALL SELECT source, size FROM buffered)
    WHERE source <> '' GROUP BY source;

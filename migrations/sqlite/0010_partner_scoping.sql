-- Per-partner scoping (D14): two partners may use the same groupId without touching each
-- other's state, so every receiver table is keyed by (partner, group_id). The partner is the
-- configured partner a request was identified as; '' is the anonymous caller, which is who
-- every row stored before this migration came from. SQLite cannot change a primary key:
-- those tables are rebuilt (create, copy, drop, rename, indexes again).

CREATE TABLE groups_scoped (
    partner       TEXT NOT NULL,
    group_id      TEXT NOT NULL,
    channel       TEXT NOT NULL,
    status        TEXT NOT NULL,
    next_deadline INTEGER,
    updated_at    INTEGER NOT NULL,
    state         TEXT NOT NULL,
    source        TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (partner, group_id)
) STRICT;
INSERT INTO groups_scoped (partner, group_id, channel, status, next_deadline, updated_at,
                           state, source)
    SELECT '', group_id, channel, status, next_deadline, updated_at, state, source FROM groups;
DROP TABLE groups;
ALTER TABLE groups_scoped RENAME TO groups;
CREATE INDEX groups_next_deadline ON groups (next_deadline) WHERE next_deadline IS NOT NULL;
CREATE INDEX groups_open_by_source ON groups (source) WHERE status = 'open';

CREATE TABLE buffered_scoped (
    partner     TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    number      INTEGER NOT NULL,
    channel     TEXT NOT NULL,
    topic       TEXT NOT NULL,
    payload     TEXT NOT NULL,
    namespaces  TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    expiry      INTEGER NOT NULL,
    PRIMARY KEY (partner, group_id, number)
) STRICT;
INSERT INTO buffered_scoped (partner, group_id, number, channel, topic, payload, namespaces,
                             received_at, expiry)
    SELECT '', group_id, number, channel, topic, payload, namespaces, received_at, expiry
      FROM buffered;
DROP TABLE buffered;
ALTER TABLE buffered_scoped RENAME TO buffered;

CREATE TABLE message_faults_scoped (
    partner   TEXT NOT NULL,
    group_id  TEXT NOT NULL,
    singleton INTEGER NOT NULL,  -- 1: the message had no SequenceNum (number is 0)
    number    INTEGER NOT NULL,  -- u64 stored bit for bit in an i64
    fault     TEXT NOT NULL,
    expiry    INTEGER NOT NULL,
    PRIMARY KEY (partner, group_id, singleton, number)
) STRICT;
INSERT INTO message_faults_scoped (partner, group_id, singleton, number, fault, expiry)
    SELECT '', group_id, singleton, number, fault, expiry FROM message_faults;
DROP TABLE message_faults;
ALTER TABLE message_faults_scoped RENAME TO message_faults;

-- Applications see who sent each delivered message.
ALTER TABLE inbox ADD COLUMN partner TEXT NOT NULL DEFAULT '';
DROP INDEX inbox_group;
CREATE INDEX inbox_group ON inbox (partner, group_id, number);

-- The partner whose message an owed ack is about: the callback presents our credentials
-- towards that partner.
ALTER TABLE pending_callbacks ADD COLUMN partner TEXT NOT NULL DEFAULT '';

-- A partner may name only its own callback endpoints ('' : those for anonymous callers).
CREATE TABLE callback_endpoints_scoped (
    partner    TEXT NOT NULL,
    url        TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (partner, url)
) STRICT;
INSERT INTO callback_endpoints_scoped (partner, url, created_at)
    SELECT '', url, created_at FROM callback_endpoints;
DROP TABLE callback_endpoints;
ALTER TABLE callback_endpoints_scoped RENAME TO callback_endpoints;

-- ordering = group in subscriptions: the ordering group is (partner, group_id), kept as one
-- opaque key (the JSON array [partner, group_id], unambiguous whatever either holds), so that
-- two partners' groups of one id never share a head, a lease or a member.
ALTER TABLE deliveries RENAME COLUMN group_id TO group_key;
UPDATE deliveries SET group_key = json_array('', group_key) WHERE group_key IS NOT NULL;
ALTER TABLE group_heads RENAME COLUMN group_id TO group_key;
UPDATE group_heads SET group_key = json_array('', group_key);
ALTER TABLE group_affinity RENAME COLUMN group_id TO group_key;
UPDATE group_affinity SET group_key = json_array('', group_key);

-- The configured partner an outbound message goes to ('' for a URL destination): only that
-- partner's acks and faults may settle it.
ALTER TABLE out_messages ADD COLUMN partner TEXT NOT NULL DEFAULT '';

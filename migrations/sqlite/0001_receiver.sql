-- Receiving RMP: group state, the inbox, the ordered buffer, callback acks we owe, and where
-- callbacks may go. Times are Unix milliseconds (UTC).

-- One row per group (a singleton is a group of one). `state` is the JSON of rmp::GroupState;
-- `next_deadline` is when the sweeper must look at the group next (NULL: never).
CREATE TABLE groups (
    group_id      TEXT PRIMARY KEY NOT NULL,
    channel       TEXT NOT NULL,
    status        TEXT NOT NULL,
    next_deadline INTEGER,
    updated_at    INTEGER NOT NULL,
    state         TEXT NOT NULL
) STRICT;
CREATE INDEX groups_next_deadline ON groups (next_deadline) WHERE next_deadline IS NOT NULL;

-- Delivery = an append here (DESIGN §5). Never updated.
CREATE TABLE inbox (
    offset      INTEGER PRIMARY KEY AUTOINCREMENT,
    channel     TEXT NOT NULL,
    topic       TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    number      INTEGER,
    payload     TEXT NOT NULL,
    namespaces  TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    expiry      INTEGER NOT NULL
) STRICT;
CREATE INDEX inbox_group ON inbox (group_id, number);

-- Ordered messages ahead of a gap, until delivered or discarded (D6, D7).
CREATE TABLE buffered (
    group_id    TEXT NOT NULL,
    number      INTEGER NOT NULL,
    channel     TEXT NOT NULL,
    topic       TEXT NOT NULL,
    payload     TEXT NOT NULL,
    namespaces  TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    expiry      INTEGER NOT NULL,
    PRIMARY KEY (group_id, number)
) STRICT;

-- Acks and faults owed to senders by the Callback pattern, until POSTed or expired (D10).
CREATE TABLE pending_callbacks (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    endpoint     TEXT NOT NULL,
    soap12       INTEGER NOT NULL,
    group_id     TEXT NOT NULL,
    number       INTEGER,          -- NULL for a singleton
    number_to    INTEGER,          -- end of a range (poll answers), NULL for one number
    fault        TEXT,
    expiry       INTEGER NOT NULL,
    next_attempt INTEGER NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX pending_callbacks_due ON pending_callbacks (next_attempt);

-- Registered callback endpoints: a Callback ReplyTo must be one of these (D10).
CREATE TABLE callback_endpoints (
    url        TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

-- Faults given to messages that left no group state behind (defective or refused on arrival),
-- so that a Poll-pattern sender learns of them when it polls (D4, D11). Kept until expiry.
CREATE TABLE message_faults (
    group_id  TEXT NOT NULL,
    singleton INTEGER NOT NULL,  -- 1: the message had no SequenceNum (number is 0)
    number    INTEGER NOT NULL,  -- u64 stored bit for bit in an i64
    fault     TEXT NOT NULL,
    expiry    INTEGER NOT NULL,
    PRIMARY KEY (group_id, singleton, number)
) STRICT;

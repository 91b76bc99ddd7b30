-- Sending RMP: our own reliable messages to partners, their groups, and their state changes.
-- Times are Unix milliseconds (UTC).

CREATE TABLE out_groups (
    group_id    TEXT PRIMARY KEY NOT NULL,
    destination TEXT NOT NULL,
    ordered     INTEGER NOT NULL,
    sequenced   INTEGER NOT NULL,
    next_number INTEGER NOT NULL,   -- the number the next submission gets
    last_number INTEGER,            -- set once a message with last="true" was submitted
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE out_messages (
    id            TEXT PRIMARY KEY NOT NULL,
    group_id      TEXT NOT NULL,
    number        INTEGER,          -- NULL for a singleton
    destination   TEXT NOT NULL,
    soap12        INTEGER NOT NULL,
    reply_pattern TEXT NOT NULL,    -- Response | Callback | Poll
    envelope      TEXT NOT NULL,    -- sent unchanged on every attempt
    expiry        INTEGER NOT NULL,
    schedule      TEXT NOT NULL,    -- JSON: the retry schedule
    state         TEXT NOT NULL,    -- queued | sent | acked | faulted | failed
    fault         TEXT,
    reason        TEXT,
    attempts      INTEGER NOT NULL,
    next_attempt  INTEGER,          -- NULL once final
    notify_url    TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX out_messages_due ON out_messages (next_attempt) WHERE next_attempt IS NOT NULL;
CREATE INDEX out_messages_group ON out_messages (group_id, number);
CREATE INDEX out_messages_state ON out_messages (state);

-- Every state change, for GET /api/v1/events and notify webhooks.
CREATE TABLE out_events (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT NOT NULL,
    state      TEXT NOT NULL,
    detail     TEXT,
    at         INTEGER NOT NULL
) STRICT;

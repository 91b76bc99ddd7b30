-- The PostgreSQL schema, one migration for what SQLite reached in thirteen: the same tables and
-- columns (times are Unix milliseconds, u64 sequence numbers are stored bit for bit in BIGINT),
-- plus what several gateways on one database need and one SQLite file never did:
--   * `wsr_identity`: whose database this is (SQLite keeps it in PRAGMA application_id);
--   * `sequences`: offsets handed out under a row lock held to commit, so that inbox offsets
--     (and out_events) become visible in commit order with no gap a cursor could skip;
--   * `lease_owner` / `lease_until` on every row a background duty claims, so that a duty runs
--     once across gateways and is taken over when the gateway holding it dies.
-- "offset" is a reserved word in PostgreSQL, hence the quotes.

CREATE TABLE wsr_identity (
    one         BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    application TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
-- In the migration's own transaction: no moment in which the tables exist unclaimed.
INSERT INTO wsr_identity (application, created_at)
    VALUES ('wsr-gateway', (extract(epoch FROM now()) * 1000)::bigint);

CREATE TABLE sequences (
    name TEXT PRIMARY KEY,
    last BIGINT NOT NULL
);
INSERT INTO sequences (name, last) VALUES ('inbox', 0), ('out_events', 0);

CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value BYTEA NOT NULL
);

-- Receiver

CREATE TABLE groups (
    id            BIGSERIAL PRIMARY KEY,
    partner       TEXT NOT NULL,
    group_id      TEXT NOT NULL,
    channel       TEXT NOT NULL,
    status        TEXT NOT NULL,
    next_deadline BIGINT,
    updated_at    BIGINT NOT NULL,
    source        TEXT NOT NULL DEFAULT '',
    state_bin     BYTEA NOT NULL,
    UNIQUE (partner, group_id)
);
CREATE INDEX groups_next_deadline ON groups (next_deadline) WHERE next_deadline IS NOT NULL;
CREATE INDEX groups_open_by_source ON groups (source) WHERE status = 'open';

CREATE TABLE inbox (
    "offset"    BIGINT PRIMARY KEY,
    channel     TEXT NOT NULL,
    topic       TEXT NOT NULL,
    partner     TEXT NOT NULL DEFAULT '',
    group_id    TEXT NOT NULL,
    number      BIGINT,
    namespaces  TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    expiry      BIGINT NOT NULL,
    payload     BYTEA NOT NULL
);
CREATE INDEX inbox_received_at ON inbox (received_at);

CREATE TABLE buffered (
    partner     TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    number      BIGINT NOT NULL,
    channel     TEXT NOT NULL,
    topic       TEXT NOT NULL,
    namespaces  TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    expiry      BIGINT NOT NULL,
    payload     BYTEA NOT NULL,
    PRIMARY KEY (partner, group_id, number)
);

CREATE TABLE pending_callbacks (
    id           BIGSERIAL PRIMARY KEY,
    partner      TEXT NOT NULL DEFAULT '',
    endpoint     TEXT NOT NULL,
    soap12       BOOLEAN NOT NULL,
    group_id     TEXT NOT NULL,
    number       BIGINT,          -- NULL for a singleton
    number_to    BIGINT,          -- end of a range (poll answers), NULL for one number
    fault        TEXT,
    expiry       BIGINT NOT NULL,
    next_attempt BIGINT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    lease_owner  TEXT,
    lease_until  BIGINT
);
CREATE INDEX pending_callbacks_due ON pending_callbacks (next_attempt);

CREATE TABLE callback_endpoints (
    partner    TEXT NOT NULL,
    url        TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (partner, url)
);

CREATE TABLE push_endpoints (
    url        TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL
);

CREATE TABLE message_faults (
    partner   TEXT NOT NULL,
    group_id  TEXT NOT NULL,
    singleton BOOLEAN NOT NULL,  -- the message had no SequenceNum (number is 0)
    number    BIGINT NOT NULL,
    fault     TEXT NOT NULL,
    expiry    BIGINT NOT NULL,
    PRIMARY KEY (partner, group_id, singleton, number)
);

-- Sender

CREATE TABLE out_groups (
    group_id    TEXT PRIMARY KEY,
    destination TEXT NOT NULL,
    ordered     BOOLEAN NOT NULL,
    sequenced   BOOLEAN NOT NULL,
    next_number BIGINT NOT NULL,   -- the number the next submission gets
    last_number BIGINT,            -- set once a message with last="true" was submitted
    created_at  BIGINT NOT NULL,
    principal   TEXT
);

CREATE TABLE out_messages (
    id               TEXT PRIMARY KEY,
    group_id         TEXT NOT NULL,
    number           BIGINT,          -- NULL for a singleton
    destination      TEXT NOT NULL,
    partner          TEXT NOT NULL DEFAULT '',
    soap12           BOOLEAN NOT NULL,
    reply_pattern    TEXT NOT NULL,    -- Response | Callback | Poll
    envelope         TEXT NOT NULL,    -- sent unchanged on every attempt
    expiry           BIGINT NOT NULL,
    schedule         TEXT NOT NULL,    -- JSON: the retry schedule
    state            TEXT NOT NULL,    -- queued | sent | acked | faulted | failed
    fault            TEXT,
    reason           TEXT,
    attempts         INTEGER NOT NULL, -- also the fence: a claim names the attempt it took
    next_attempt     BIGINT,           -- NULL once final
    notify_url       TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    idem_principal   TEXT,
    idem_key         TEXT,
    idem_fingerprint TEXT,
    unreached        INTEGER NOT NULL DEFAULT 0, -- attempts known never to have arrived
    last_error       TEXT,
    last_error_at    BIGINT,
    principal        TEXT,
    lease_owner      TEXT,
    lease_until      BIGINT
);
CREATE INDEX out_messages_due ON out_messages (next_attempt) WHERE next_attempt IS NOT NULL;
CREATE INDEX out_messages_group ON out_messages (group_id, number);
CREATE INDEX out_messages_state ON out_messages (state);
CREATE UNIQUE INDEX out_messages_idempotency ON out_messages (idem_principal, idem_key)
    WHERE idem_key IS NOT NULL;
CREATE INDEX out_messages_principal ON out_messages (principal, id);

CREATE TABLE out_events (
    seq        BIGINT PRIMARY KEY,
    message_id TEXT NOT NULL,
    state      TEXT NOT NULL,
    detail     TEXT,
    at         BIGINT NOT NULL
);
CREATE INDEX out_events_message ON out_events (message_id, seq);

-- Delivery

CREATE TABLE subscriptions (
    id         BIGSERIAL PRIMARY KEY,
    name       TEXT NOT NULL UNIQUE,
    filter     TEXT NOT NULL,
    owner      TEXT NOT NULL,
    rules      TEXT NOT NULL,
    cursor     BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    idle_since BIGINT
);

CREATE TABLE grants (
    subscription_id BIGINT NOT NULL REFERENCES subscriptions (id) ON DELETE CASCADE,
    principal       TEXT NOT NULL,
    PRIMARY KEY (subscription_id, principal)
);

CREATE TABLE sessions (
    id              TEXT PRIMARY KEY,
    subscription_id BIGINT NOT NULL,
    principal       TEXT NOT NULL,
    ttl_ms          BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL
);
CREATE INDEX sessions_subscription ON sessions (subscription_id);
CREATE INDEX sessions_expiry ON sessions (expires_at);

CREATE TABLE deliveries (
    subscription_id BIGINT NOT NULL,
    "offset"        BIGINT NOT NULL,
    group_key       TEXT,
    state           TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    failures        INTEGER NOT NULL,
    consumer        TEXT,
    due             BIGINT NOT NULL,
    avoid           TEXT NOT NULL,
    reason          TEXT,
    PRIMARY KEY (subscription_id, "offset")
);
CREATE INDEX deliveries_waiting ON deliveries (subscription_id, state, "offset");
CREATE INDEX deliveries_group ON deliveries (subscription_id, group_key, "offset")
    WHERE group_key IS NOT NULL;
CREATE INDEX deliveries_acquired ON deliveries (due) WHERE state = 'acquired';
CREATE INDEX deliveries_offset ON deliveries ("offset");
CREATE INDEX deliveries_group_acquired ON deliveries (subscription_id, group_key)
    WHERE state = 'acquired';

CREATE TABLE group_affinity (
    subscription_id BIGINT NOT NULL,
    group_key       TEXT NOT NULL,
    consumer        TEXT NOT NULL,
    PRIMARY KEY (subscription_id, group_key)
);
CREATE INDEX group_affinity_consumer ON group_affinity (consumer);

CREATE TABLE group_heads (
    subscription_id BIGINT NOT NULL,
    group_key       TEXT NOT NULL,
    head            BIGINT NOT NULL,
    PRIMARY KEY (subscription_id, group_key)
);
CREATE INDEX group_heads_order ON group_heads (subscription_id, head);

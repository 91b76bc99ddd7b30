-- Delivery to applications (DESIGN §5): subscriptions with their cursors, grants, consumer
-- sessions, one lease per (subscription, message), group affinity, registered push webhooks,
-- and the receipt key. Times are Unix milliseconds (UTC).

-- Secrets and settings that must survive a restart (the receipt key).
CREATE TABLE settings (
    key   TEXT PRIMARY KEY NOT NULL,
    value BLOB NOT NULL
) STRICT;

-- `name` is the identity: a plain name, or `$share/{share}/{filter}`. `rules` is the JSON of
-- delivery::subscription::Rules. `cursor`: every inbox message up to this offset has been
-- matched against the filter (and, when it matched, has a row in `deliveries`).
-- `idle_since`: an ephemeral subscription without members since then (removed after a grace).
CREATE TABLE subscriptions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL UNIQUE,
    filter     TEXT NOT NULL,
    owner      TEXT NOT NULL,
    rules      TEXT NOT NULL,
    cursor     INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    idle_since INTEGER
) STRICT;

-- Principals other than the owner that may join a subscription.
CREATE TABLE grants (
    subscription_id INTEGER NOT NULL,
    principal       TEXT NOT NULL,
    PRIMARY KEY (subscription_id, principal)
) STRICT;

-- Consumer sessions (members): alive until `expires_at` unless renewed by fetch or heartbeat.
CREATE TABLE sessions (
    id              TEXT PRIMARY KEY NOT NULL,
    subscription_id INTEGER NOT NULL,
    principal       TEXT NOT NULL,
    ttl_ms          INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL
) STRICT;
CREATE INDEX sessions_subscription ON sessions (subscription_id);
CREATE INDEX sessions_expiry ON sessions (expires_at);

-- One message in one subscription: the state of delivery::lease::Lease.
-- state: available (due = not before) | acquired (due = deadline, consumer = holder)
--      | done | dead (reason). `group_id` only for ordering = group.
CREATE TABLE deliveries (
    subscription_id INTEGER NOT NULL,
    offset          INTEGER NOT NULL,
    group_id        TEXT,
    state           TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    failures        INTEGER NOT NULL,
    consumer        TEXT,
    due             INTEGER NOT NULL,
    avoid           TEXT NOT NULL,
    reason          TEXT,
    PRIMARY KEY (subscription_id, offset)
) STRICT;
CREATE INDEX deliveries_waiting ON deliveries (subscription_id, state, offset);
CREATE INDEX deliveries_group ON deliveries (subscription_id, group_id, offset)
    WHERE group_id IS NOT NULL;
CREATE INDEX deliveries_acquired ON deliveries (due) WHERE state = 'acquired';
CREATE INDEX deliveries_offset ON deliveries (offset);

-- ordering = group: the member a group is bound to while it lives.
CREATE TABLE group_affinity (
    subscription_id INTEGER NOT NULL,
    group_id        TEXT NOT NULL,
    consumer        TEXT NOT NULL,
    PRIMARY KEY (subscription_id, group_id)
) STRICT;
CREATE INDEX group_affinity_consumer ON group_affinity (consumer);

-- Webhooks a push subscription may POST to.
CREATE TABLE push_endpoints (
    url        TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

CREATE INDEX inbox_received_at ON inbox (received_at);

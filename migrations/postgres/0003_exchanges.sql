-- Request-response operations (D16): one row per request a channel's responder is answering
-- or has answered, keyed as the group state keys it (a singleton is number 0). `calling`: a
-- call went out and its outcome is not known yet; `answered`: the business response every
-- copy of the request gets, byte for byte; `in_doubt`: the outcome stayed unknown and the
-- channel says `on_unknown = "fail"`. Kept until the request's ExpiryTime plus
-- `delivered_id_retention_seconds` (`keep_until`, Unix ms); `size` counts against the
-- source's byte quota.
CREATE TABLE exchanges (
    partner      TEXT NOT NULL,
    group_id     TEXT NOT NULL,
    number       BIGINT NOT NULL,
    channel      TEXT NOT NULL,
    source       TEXT NOT NULL,
    state        TEXT NOT NULL,
    started_at   BIGINT NOT NULL,
    status       BIGINT NOT NULL DEFAULT 0,
    content_type TEXT NOT NULL DEFAULT '',
    body         BYTEA,
    size         BIGINT NOT NULL DEFAULT 0,
    keep_until   BIGINT NOT NULL,
    PRIMARY KEY (partner, group_id, number)
);
CREATE INDEX exchanges_by_source ON exchanges (source, keep_until);
CREATE INDEX exchanges_by_keep ON exchanges (keep_until);
CREATE INDEX exchanges_in_doubt ON exchanges (state, started_at);

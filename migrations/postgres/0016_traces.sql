-- Trace contexts (issue 34), kept only while traces are exported: the W3C traceparent a
-- received message came in with (by partner, group and number; 0 for a singleton), and the
-- one an outbound message was submitted in, so that the message's later work joins its trace.
-- Purged after seven days by the sweeper.
CREATE TABLE message_traces (
    partner     TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    number      BIGINT NOT NULL,
    traceparent TEXT NOT NULL,
    at          BIGINT NOT NULL,
    PRIMARY KEY (partner, group_id, number)
);
CREATE INDEX message_traces_at ON message_traces (at);
CREATE TABLE out_traces (
    message_id  TEXT PRIMARY KEY,
    traceparent TEXT NOT NULL,
    at          BIGINT NOT NULL
);
CREATE INDEX out_traces_at ON out_traces (at);

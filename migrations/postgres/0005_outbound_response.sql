-- A partner's business response to one of our messages (Notify with a response, D16): its
-- answer as received (content type and bytes, at most max_message_bytes), kept with the
-- message and removed with it. Times are Unix milliseconds (UTC).
CREATE TABLE out_responses (
    message_id   TEXT PRIMARY KEY REFERENCES out_messages (id) ON DELETE CASCADE,
    content_type TEXT NOT NULL,
    body         BYTEA NOT NULL,
    size         BIGINT NOT NULL,
    soap_fault   BOOLEAN NOT NULL,  -- the Body is an application SOAP Fault
    received_at  BIGINT NOT NULL
);

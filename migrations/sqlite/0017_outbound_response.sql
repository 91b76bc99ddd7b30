-- A partner's business response to one of our messages (Notify with a response, D16): its
-- answer as received (content type and bytes, at most max_message_bytes), kept with the
-- message and removed with it. Times are Unix milliseconds (UTC).
CREATE TABLE out_responses (
    message_id   TEXT PRIMARY KEY NOT NULL REFERENCES out_messages (id) ON DELETE CASCADE,
    content_type TEXT NOT NULL,
    body         BLOB NOT NULL,
    size         INTEGER NOT NULL,
    soap_fault   INTEGER NOT NULL,  -- the Body is an application SOAP Fault
    received_at  INTEGER NOT NULL
) STRICT;

-- Every outbound message's story (issue 33): each send and each poll that asked about it, with
-- its time, the partner's HTTP status (NULL: no answer came), what the answer said of the
-- message (`ack`, `fault` with its code, `none`) and, when it came to nothing, why. `n`
-- numbers a message's attempts from 1; the first 5 and the latest 20 are kept (the rows
-- between are deleted as new ones come), so MAX(n) is how many there were. Written under the
-- message's row lock, so two gateways never number one message's attempts alike.
CREATE TABLE out_attempts (
    message_id text NOT NULL,
    n          bigint NOT NULL,
    kind       text NOT NULL,
    at         bigint NOT NULL,
    status     integer,
    verdict    text NOT NULL,
    fault      text,
    cause      text,
    PRIMARY KEY (message_id, n)
);
-- When a poll last asked about the message: the next one is a poll interval later.
ALTER TABLE out_messages ADD COLUMN last_poll_at bigint;

-- Each partner's health as the senders of every gateway see it (issue 33): when an attempt or
-- poll to it last got an answer, its latest failure and when, and how many failed in a row
-- since the last answer. Written with every attempt's story line; '' is URL destinations.
CREATE TABLE partner_health (
    partner          text PRIMARY KEY,
    last_success_at  bigint,
    last_error       text,
    last_error_at    bigint,
    failures_in_row  integer NOT NULL DEFAULT 0
);

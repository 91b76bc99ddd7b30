-- Each partner's health as the sender sees it (issue 33): when an attempt or poll to it last
-- got an answer, its latest failure and when, and how many failed in a row since the last
-- answer. Written with every attempt's story line; '' is URL destinations.
CREATE TABLE partner_health (
    partner          TEXT PRIMARY KEY NOT NULL,
    last_success_at  INTEGER,
    last_error       TEXT,
    last_error_at    INTEGER,
    failures_in_row  INTEGER NOT NULL DEFAULT 0
) STRICT;

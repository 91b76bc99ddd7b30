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

-- The console's rates over time count the last hour's sends and ended messages per minute
-- through these (`overview::read_rates!`), never by scanning the whole history.
CREATE INDEX out_attempts_sends ON out_attempts (at) WHERE kind = 'send';
CREATE INDEX out_events_state_at ON out_events (state, at);

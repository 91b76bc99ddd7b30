-- The audit trail (issue 34): every operator action that changes something — resend, fail,
-- send again, group abort, push pause and resume, dead-letter replay and purge, endpoint
-- registration — with who (the token's principal), when, what and on what. Rows older than
-- `AUDIT_KEPT_DAYS` are deleted with the console's expired sign-outs.
CREATE TABLE audit_log (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    at        INTEGER NOT NULL,
    principal TEXT NOT NULL,
    action    TEXT NOT NULL,
    target    TEXT NOT NULL,
    detail    TEXT
) STRICT;
CREATE INDEX audit_log_at ON audit_log (at);

-- The audit trail (issue 34): every operator action that changes something — resend, fail,
-- send again, group abort, push pause and resume, dead-letter replay and purge, endpoint
-- registration — with who (the token's principal), when, what and on what. Rows older than
-- `AUDIT_KEPT_DAYS` are deleted with the console's expired sign-outs.
CREATE TABLE audit_log (
    seq       BIGSERIAL PRIMARY KEY,
    at        bigint NOT NULL,
    principal text NOT NULL,
    action    text NOT NULL,
    target    text NOT NULL,
    detail    text
);
CREATE INDEX audit_log_at ON audit_log (at);

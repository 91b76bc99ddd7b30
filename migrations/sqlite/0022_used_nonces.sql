-- Nonces used once (D14): a partner's WS-Security UsernameToken `Nonce`, kept until its
-- freshness window has passed (`until`, Unix ms), so that a token seen again within it — on
-- this gateway, after a restart — is refused as a replay. The sweeper deletes rows past
-- `until`.
CREATE TABLE used_nonces (
    scope TEXT NOT NULL,
    nonce TEXT NOT NULL,
    until INTEGER NOT NULL,
    PRIMARY KEY (scope, nonce)
) WITHOUT ROWID;
CREATE INDEX used_nonces_by_until ON used_nonces (until);

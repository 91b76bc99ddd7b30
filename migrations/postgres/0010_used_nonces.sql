-- Nonces used once (D14): a partner's WS-Security UsernameToken `Nonce`, kept until its
-- freshness window has passed (`until`, Unix ms), so that a token seen again within it — at
-- any gateway of the cluster, after a restart — is refused as a replay. The sweeper deletes
-- rows past `until`.
CREATE TABLE used_nonces (
    scope text COLLATE "C" NOT NULL,
    nonce text COLLATE "C" NOT NULL,
    until bigint NOT NULL,
    PRIMARY KEY (scope, nonce)
);
CREATE INDEX used_nonces_by_until ON used_nonces (until);

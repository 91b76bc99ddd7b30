-- Console sign-outs: the nonce of each console sign-in ended by Log out, until the sign-in
-- would have ended anyway (`until`, Unix ms: the cookie's expiry). Every console request of
-- every gateway looks its cookie's nonce up here, so that a copy of a signed-out cookie is
-- refused everywhere; the sweeper deletes rows past `until`.
CREATE TABLE console_signouts (
    nonce TEXT PRIMARY KEY,
    until BIGINT NOT NULL
);
CREATE INDEX console_signouts_by_until ON console_signouts (until);

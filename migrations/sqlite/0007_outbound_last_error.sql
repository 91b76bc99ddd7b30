-- The cause of a message's latest failed attempt (send or poll: unreachable, timeout, an error
-- status, a redirect, an answer beyond the cap, an unreadable answer) and when it happened, so
-- that a message stuck in `sent` says why. Kept when a later attempt succeeds; NULL while
-- nothing failed.
ALTER TABLE out_messages ADD COLUMN last_error TEXT;
ALTER TABLE out_messages ADD COLUMN last_error_at INTEGER;

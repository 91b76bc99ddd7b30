-- Idempotent submits: an application may send `Idempotency-Key` with POST /api/v1/messages.
-- The key is scoped by the caller's principal; a retry with the same key and the same request
-- (same fingerprint: SHA-256 of the canonical resolved request, hex) answers the message stored
-- the first time instead of creating another one. NULL for submissions without a key.
ALTER TABLE out_messages ADD COLUMN idem_principal TEXT;
ALTER TABLE out_messages ADD COLUMN idem_key TEXT;
ALTER TABLE out_messages ADD COLUMN idem_fingerprint TEXT;
CREATE UNIQUE INDEX out_messages_idempotency ON out_messages (idem_principal, idem_key)
    WHERE idem_key IS NOT NULL;

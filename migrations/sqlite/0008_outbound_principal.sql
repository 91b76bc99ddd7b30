-- Who submitted each outbound message and who started each outbound group: a produce principal
-- lists, reads, streams, continues and closes only its own (operators see all). Earlier rows
-- learn their principal from their Idempotency-Key where they had one; the rest (NULL) are
-- visible to operators only.
ALTER TABLE out_messages ADD COLUMN principal TEXT;
ALTER TABLE out_groups ADD COLUMN principal TEXT;
UPDATE out_messages SET principal = idem_principal WHERE idem_principal IS NOT NULL;
UPDATE out_groups SET principal = (
    SELECT m.principal FROM out_messages m
     WHERE m.group_id = out_groups.group_id AND m.principal IS NOT NULL
     ORDER BY m.number LIMIT 1);
CREATE INDEX out_messages_principal ON out_messages (principal, id);

-- The console shows one outbound message's history (`out_message_events`): without this it
-- would scan every message's events. PostgreSQL has had the same index from its first schema.
CREATE INDEX IF NOT EXISTS out_events_message ON out_events (message_id, seq);

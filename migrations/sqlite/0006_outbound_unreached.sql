-- Attempts known never to have arrived (the connection was refused): when every attempt of an
-- expired message is one, it was certainly not delivered and needs no poll to fail it.
ALTER TABLE out_messages ADD COLUMN unreached INTEGER NOT NULL DEFAULT 0;

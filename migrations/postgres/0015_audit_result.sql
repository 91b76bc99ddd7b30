-- What came of each audited action (issue 34): `done`, or `refused: …` (a console sign-in
-- refused, an operator action the gateway would not take). Entries before it were all done.
ALTER TABLE audit_log ADD COLUMN result TEXT NOT NULL DEFAULT 'done';

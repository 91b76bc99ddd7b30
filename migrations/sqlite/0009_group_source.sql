-- Who opened each group (the peer's IP address until partners authenticate): new groups are
-- counted per source against `max_open_groups_per_source` (D13), with this index so the
-- count reads only that source's open groups. Groups stored before have no known source.
ALTER TABLE groups ADD COLUMN source TEXT NOT NULL DEFAULT '';
CREATE INDEX groups_open_by_source ON groups (source) WHERE status = 'open';

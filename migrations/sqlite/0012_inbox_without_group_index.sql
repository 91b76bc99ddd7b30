-- No query reads the inbox by (partner, group_id, number): deliveries, polls and purges go by
-- offset, retention by received_at. The index only cost a write to a random page of its B-tree
-- for every message stored (group ids are the partners' random UUIDs), a third of the pages a
-- singleton's commit wrote.
DROP INDEX IF EXISTS inbox_group;

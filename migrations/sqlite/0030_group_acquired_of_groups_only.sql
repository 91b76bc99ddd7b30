-- "Is any message of this group leased?" is asked of groups only (ordering = group), but the
-- index answering it (0004) held every leased message, grouped or not: a subscription without
-- ordering paid an entry written as each message was handed out and deleted as it was
-- settled, for nothing (issue 35). The query's `group_key = …` implies the new condition, so
-- it still uses the index.
DROP INDEX deliveries_group_acquired;
CREATE INDEX deliveries_group_acquired ON deliveries (subscription_id, group_key)
    WHERE state = 'acquired' AND group_key IS NOT NULL;

-- ordering = group: each group's head, the lowest offset still waiting or leased in the
-- subscription. A fetch looks at one row per group instead of at every waiting message, so a
-- group with a long backlog costs no more than a short one.
CREATE TABLE group_heads (
    subscription_id INTEGER NOT NULL,
    group_id        TEXT NOT NULL,
    head            INTEGER NOT NULL,
    PRIMARY KEY (subscription_id, group_id)
) STRICT;
CREATE INDEX group_heads_order ON group_heads (subscription_id, head);

-- "Is any message of this group leased?" without walking the group.
CREATE INDEX deliveries_group_acquired ON deliveries (subscription_id, group_id)
    WHERE state = 'acquired';

INSERT INTO group_heads (subscription_id, group_id, head)
    SELECT subscription_id, group_id, MIN(offset) FROM deliveries
    WHERE group_id IS NOT NULL AND state IN ('available', 'acquired')
    GROUP BY subscription_id, group_id;

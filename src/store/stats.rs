//! The store's counts for `/metrics` (`Backend::stats`): cheap COUNT and GROUP BY reads of
//! what is in the store now, the same on every gateway of a cluster.

/// What the store holds now, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Callback acks and faults owed to partners, not yet taken.
    pub pending_callbacks: u64,
    /// Ordered messages held for a gap, over every group.
    pub buffered_messages: u64,
    /// Received groups by status (`open`, `complete`, `expired`, `aborted`, …), by name.
    pub groups: Vec<(String, u64)>,
    /// Our messages by state (`queued`, `sent`, `acked`, `faulted`, `failed`), by name.
    pub outbound: Vec<(String, u64)>,
    /// Every subscription, by name.
    pub subscriptions: Vec<SubscriptionStats>,
}

/// One subscription's matched messages by state (as `Backlog`, without the unmatched).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriptionStats {
    pub name: String,
    pub waiting: u64,
    pub in_flight: u64,
    pub dead_letters: u64,
    /// Inbox messages past its cursor not matched against its filter yet (the next fetch or
    /// push does; some may not match). Counted up to `UNMATCHED_COUNTED`.
    pub unmatched: u64,
}

/// The most unmatched inbox messages counted per subscription: a subscription nobody reads
/// must not make every scrape count the whole inbox.
pub const UNMATCHED_COUNTED: i64 = 100_000;

/// `Backend::stats` on either backend's sqlx pool (`$pool`: `&SqlitePool` or `&PgPool`): one
/// COUNT or GROUP BY per table, and per subscription three counts on the `deliveries_waiting`
/// index (subscription, state, offset). A macro, not a generic function: the SQL is the same
/// text for both, and sqlx's bounds for "any pool" would say more than the queries do.
macro_rules! read_stats {
    ($pool:expr) => {{
        let pool = $pool;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let (pending_callbacks, buffered_messages): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM pending_callbacks), (SELECT COUNT(*) FROM buffered)",
        )
        .fetch_one(pool)
        .await?;
        let by = |sql| async move {
            let rows: Vec<(String, i64)> = sqlx::query_as(sql).fetch_all(pool).await?;
            Ok::<_, $crate::store::StoreError>(rows.into_iter().map(|(k, n)| (k, count(n))).collect())
        };
        let groups = by("SELECT status, COUNT(*) FROM groups GROUP BY status ORDER BY status").await?;
        let outbound =
            by("SELECT state, COUNT(*) FROM out_messages GROUP BY state ORDER BY state").await?;
        let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT s.name, \
             (SELECT COUNT(*) FROM deliveries d WHERE d.subscription_id = s.id AND d.state = 'available'), \
             (SELECT COUNT(*) FROM deliveries d WHERE d.subscription_id = s.id AND d.state = 'acquired'), \
             (SELECT COUNT(*) FROM deliveries d WHERE d.subscription_id = s.id AND d.state = 'dead'), \
             (SELECT COUNT(*) FROM (SELECT 1 FROM inbox i WHERE i.offset > s.cursor LIMIT $1) u) \
             FROM subscriptions s ORDER BY s.name",
        )
        .bind($crate::store::stats::UNMATCHED_COUNTED)
        .fetch_all(pool)
        .await?;
        Ok($crate::store::StoreStats {
            pending_callbacks: count(pending_callbacks),
            buffered_messages: count(buffered_messages),
            groups,
            outbound,
            subscriptions: rows
                .into_iter()
                .map(|(name, waiting, in_flight, dead, unmatched)| $crate::store::SubscriptionStats {
                    name,
                    waiting: count(waiting),
                    in_flight: count(in_flight),
                    dead_letters: count(dead),
                    unmatched: count(unmatched),
                })
                .collect(),
        })
    }};
}
pub(in crate::store) use read_stats;

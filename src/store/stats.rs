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
}

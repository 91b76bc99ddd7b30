//! Delivery to applications (DESIGN §5): the push webhooks registered at start, a session's
//! default TTL, how long an ephemeral subscription outlives its last member, and how long the
//! inbox keeps what no subscription needs, and the byte bounds of fetch answers and pushes. Settings only; `delivery/` decides with them.

use super::bounds::millis;
use super::file::FileConfig;

/// Settings of delivery to applications (DESIGN §5).
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    pub push_endpoints: Vec<String>,
    pub session_ttl: chrono::Duration,
    pub ephemeral_grace: chrono::Duration,
    pub inbox_retention: chrono::Duration,
    /// Most payload bytes one fetch answers with (at least one message).
    pub max_fetch_bytes: usize,
    /// Most payload bytes one push subscription has in flight (at least one message).
    pub max_push_bytes_in_flight: usize,
    pub max_subscriptions_per_principal: usize,
    pub max_sessions_per_subscription: usize,
}

impl DeliverySettings {
    /// The settings as the file gives them, each clamped so that no deadline can overflow.
    /// (The push endpoints' URLs are checked with the other endpoints.)
    pub(super) fn from_file(f: &FileConfig) -> DeliverySettings {
        DeliverySettings {
            push_endpoints: f.push_endpoints.clone(),
            session_ttl: millis(f.session_ttl_ms.max(1)),
            ephemeral_grace: millis(f.ephemeral_grace_ms),
            inbox_retention: millis(f.inbox_retention_seconds.saturating_mul(1000)),
            max_fetch_bytes: f.max_fetch_bytes.max(1),
            max_push_bytes_in_flight: f.max_push_bytes_in_flight.max(1),
            max_subscriptions_per_principal: f.max_subscriptions_per_principal,
            max_sessions_per_subscription: f.max_sessions_per_subscription,
        }
    }
}

//! Delivery to applications (DESIGN §5): the push webhooks registered at start, a session's
//! default TTL, how long an ephemeral subscription outlives its last member, and how long the
//! inbox keeps what no subscription needs. Settings only; `delivery/` decides with them.

use super::bounds::millis;
use super::file::FileConfig;

/// Settings of delivery to applications (DESIGN §5).
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    pub push_endpoints: Vec<String>,
    pub session_ttl: chrono::Duration,
    pub ephemeral_grace: chrono::Duration,
    pub inbox_retention: chrono::Duration,
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
        }
    }
}

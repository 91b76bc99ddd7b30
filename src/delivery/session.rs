//! Consumer sessions (members of a subscription, DESIGN §5): alive for their TTL, renewed by
//! every fetch and heartbeat. A member that disappears — it leaves, its TTL passes, its grant
//! is withdrawn — gives back what it held to the other members at once, and an ephemeral
//! subscription left without members starts its grace period.

use chrono::{DateTime, Duration, Utc};

use super::lease::{Lease, Policy};

/// Whether a session that lives until `expires_at` has lapsed at `now`.
pub fn lapsed(expires_at: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    expires_at < now
}

/// When a session renewed at `now` lapses.
pub fn renewed(now: DateTime<Utc>, ttl: Duration) -> DateTime<Utc> {
    now.checked_add_signed(ttl)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// When a member waiting for messages renews its session at the latest, so that a wait never
/// outlives it: half its TTL after the last renewal.
pub fn renew_by(renewed_at: DateTime<Utc>, ttl: Duration) -> DateTime<Utc> {
    renewed(renewed_at, ttl / 2)
}

/// What ending a session changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The leases it held, released to the other members (the attempt does not count).
    pub released: Vec<(i64, Lease)>,
    /// An ephemeral subscription left without members is idle from now (removed after its
    /// grace period).
    pub idle_since: Option<DateTime<Utc>>,
}

/// Ends session `gone`: `held` are its leases, `members_left` the sessions the subscription
/// still has without it. Its groups lose their affinity to it in every case.
pub fn end(
    gone: &str,
    held: Vec<(i64, Lease)>,
    policy: &Policy,
    durable: bool,
    members_left: usize,
    now: DateTime<Utc>,
) -> Ended {
    let released = held
        .into_iter()
        .map(|(offset, mut lease)| {
            lease.holder_gone(gone, now, policy);
            (offset, lease)
        })
        .collect();
    Ended {
        released,
        idle_since: (!durable && members_left == 0).then_some(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::lease::State;
    use crate::delivery::lease::tests::{policy, t0};

    #[test]
    fn a_lapsed_member_releases_its_in_flight_deliveries_at_once_uncounted() {
        let mut held = Lease::new(t0());
        held.acquire("gone", t0(), &policy());
        assert!(!lapsed(
            renewed(t0(), Duration::seconds(2)),
            t0() + Duration::seconds(2)
        ));
        assert!(lapsed(
            renewed(t0(), Duration::seconds(2)),
            t0() + Duration::milliseconds(2_001)
        ));
        let later = t0() + Duration::seconds(3);
        let ended = end("gone", vec![(5, held)], &policy(), true, 1, later);
        let (offset, lease) = &ended.released[0];
        assert_eq!(*offset, 5);
        assert_eq!(lease.failures, 0, "not counted");
        assert!(
            lease.available_to("other", false, later),
            "free at once, not after the ack wait"
        );
        assert!(matches!(lease.state, State::Available { .. }));
        assert_eq!(ended.idle_since, None, "durable");
    }

    #[test]
    fn an_ephemeral_subscription_is_idle_once_its_last_member_is_gone() {
        let ended = end("a", Vec::new(), &policy(), false, 0, t0());
        assert_eq!(ended.idle_since, Some(t0()));
        let ended = end("a", Vec::new(), &policy(), false, 1, t0());
        assert_eq!(ended.idle_since, None, "another member is still there");
    }

    #[test]
    fn a_waiting_member_renews_at_half_its_ttl() {
        assert_eq!(
            renew_by(t0(), Duration::seconds(30)),
            t0() + Duration::seconds(15)
        );
    }
}

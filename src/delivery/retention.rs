//! Inbox retention (DESIGN §5): an inbox message is kept while some subscription still needs
//! it — not yet matched against a subscription's filter, or waiting, leased or dead-lettered
//! in one — and purged once nobody does and both its arrival and its last settling are older
//! than the retention.

use chrono::{DateTime, Duration, Utc};

/// What one subscription holds of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Settled (done) at this time.
    Settled(DateTime<Utc>),
    /// Waiting, leased or dead-lettered: still needed.
    Open,
}

/// Messages that arrived before this may be purged at `now`.
pub fn purge_before(now: DateTime<Utc>, retention: Duration) -> DateTime<Utc> {
    now.checked_sub_signed(retention)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Whether the message that arrived at `received_at` may be purged at `now`. `matched_by_all`:
/// every subscription's cursor is past it; `holds`: what each subscription that matched it
/// holds of it.
pub fn purgeable(
    received_at: DateTime<Utc>,
    matched_by_all: bool,
    holds: &[Hold],
    now: DateTime<Utc>,
    retention: Duration,
) -> bool {
    let before = purge_before(now, retention);
    received_at < before
        && matched_by_all
        && holds
            .iter()
            .all(|h| matches!(h, Hold::Settled(at) if *at < before))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::lease::tests::t0;

    #[test]
    fn a_message_goes_once_nobody_needs_it_and_its_retention_passed() {
        let hour = Duration::hours(1);
        let now = t0() + Duration::hours(2);
        assert!(
            purgeable(t0(), true, &[], now, hour),
            "matched by nobody, old"
        );
        assert!(
            !purgeable(t0(), false, &[], now, hour),
            "not yet matched by someone"
        );
        assert!(
            !purgeable(t0(), true, &[Hold::Open], now, hour),
            "still held"
        );
        let settled_late = Hold::Settled(now - Duration::minutes(5));
        assert!(
            !purgeable(t0(), true, &[settled_late], now, hour),
            "settled recently"
        );
        let settled_early = Hold::Settled(t0());
        assert!(purgeable(
            t0(),
            true,
            &[settled_early, settled_early],
            now,
            hour
        ));
        assert!(
            !purgeable(now - Duration::minutes(1), true, &[], now, hour),
            "recent arrival"
        );
    }
}

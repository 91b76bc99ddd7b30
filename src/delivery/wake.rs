//! When a delivery worker looks again without being told (DESIGN §5, §7): waiting is by
//! notification — a commit that may have made something available wakes the waiters — and
//! otherwise until the next moment time alone changes something: a backoff ends, a lease or a
//! session lapses, an idle ephemeral subscription's grace ends, an inbox message's retention
//! ends. The store reads the earliest of each; these rules say when that is.

use chrono::{DateTime, Duration, Utc};

/// The earliest time-driven changes the store knows of (all `None`: nothing waits on time).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deadlines {
    /// The earliest end of a backoff (a waiting message's not-before still in the future).
    pub backoff_ends: Option<DateTime<Utc>>,
    /// The earliest deadline of a leased message.
    pub lease_deadline: Option<DateTime<Utc>>,
    /// The earliest expiry of a session.
    pub session_expiry: Option<DateTime<Utc>>,
    /// The earliest start of an ephemeral subscription's idleness (maintenance only).
    pub idle_since: Option<DateTime<Utc>>,
    /// The earliest arrival in the inbox (maintenance only).
    pub oldest_inbox: Option<DateTime<Utc>>,
}

/// A lease or session lapses once its time has passed, not at it.
const JUST_AFTER: Duration = Duration::milliseconds(1);

fn after(t: DateTime<Utc>) -> DateTime<Utc> {
    t.checked_add_signed(JUST_AFTER).unwrap_or(t)
}

fn earliest(times: impl IntoIterator<Item = Option<DateTime<Utc>>>) -> Option<DateTime<Utc>> {
    times.into_iter().flatten().min()
}

/// When a member that found nothing should fetch again, if no commit wakes it first.
pub fn next_fetch(d: &Deadlines) -> Option<DateTime<Utc>> {
    earliest([
        d.backoff_ends,
        d.lease_deadline.map(after),
        d.session_expiry.map(after),
    ])
}

/// When the next maintenance pass has something to do, if no commit changes the deadlines
/// first. `last_purge`: when the inbox purge last ran; a message no longer needed at some
/// point after that is purged within a retention of it. `now`: when `d` was read.
///
/// Inbox appends do not wake the housekeeper (one a millisecond under load, and they never
/// bring an earlier deadline: the oldest message stays the oldest). With the inbox empty at
/// `now`, a message appended later comes due a retention after `now` at the earliest, so the
/// housekeeper looks again then.
pub fn next_maintenance(
    d: &Deadlines,
    grace: Duration,
    retention: Duration,
    last_purge: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let plus = |t: DateTime<Utc>, by: Duration| t.checked_add_signed(by);
    // The oldest message's retention ends after the last purge: that is when. It ended
    // before, and the message was still needed: what settles after the last purge comes due
    // within a retention of it.
    let purge = match d.oldest_inbox {
        Some(oldest) => plus(oldest, retention)
            .filter(|due| *due > last_purge)
            .or_else(|| plus(last_purge, retention)),
        None => plus(now, retention),
    };
    earliest([
        d.lease_deadline.map(after),
        d.session_expiry.map(after),
        d.idle_since.and_then(|idle| plus(idle, grace)).map(after),
        purge,
    ])
}

/// Whether an ephemeral subscription idle since `idle_since` is to be removed at `now`.
pub fn abandoned(idle_since: DateTime<Utc>, grace: Duration, now: DateTime<Utc>) -> bool {
    idle_since
        .checked_add_signed(grace)
        .is_some_and(|end| end < now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::lease::tests::t0;

    #[test]
    fn a_fetcher_looks_again_when_a_backoff_ends_or_just_after_a_lapse() {
        let d = Deadlines {
            backoff_ends: Some(t0() + Duration::seconds(5)),
            lease_deadline: Some(t0() + Duration::seconds(3)),
            session_expiry: Some(t0() + Duration::seconds(9)),
            ..Deadlines::default()
        };
        assert_eq!(next_fetch(&d), Some(t0() + Duration::milliseconds(3_001)));
        assert_eq!(
            next_fetch(&Deadlines::default()),
            None,
            "only a commit wakes it"
        );
    }

    #[test]
    fn maintenance_waits_for_the_grace_and_the_retention() {
        let grace = Duration::seconds(30);
        let retention = Duration::hours(1);
        let d = Deadlines {
            idle_since: Some(t0()),
            oldest_inbox: Some(t0()),
            ..Deadlines::default()
        };
        assert_eq!(
            next_maintenance(&d, grace, retention, t0(), t0()),
            Some(t0() + Duration::milliseconds(30_001))
        );
        let d = Deadlines {
            oldest_inbox: Some(t0()),
            ..Deadlines::default()
        };
        // The oldest message was still needed at the last purge: a retention after that.
        let last = t0() + Duration::hours(2);
        assert_eq!(
            next_maintenance(&d, grace, retention, last, last),
            Some(last + retention)
        );
        // An empty inbox: whatever is appended after now is due a retention later at the
        // earliest.
        let later = t0() + Duration::minutes(5);
        assert_eq!(
            next_maintenance(&Deadlines::default(), grace, retention, t0(), later),
            Some(later + retention)
        );
        assert!(!abandoned(t0(), grace, t0() + grace));
        assert!(abandoned(t0(), grace, t0() + grace + JUST_AFTER));
    }
}

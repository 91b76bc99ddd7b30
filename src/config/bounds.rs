//! The outer bounds of the time settings: the longest retention, the default and the largest
//! horizon, and the check that keeps a horizon inside them. A leaf of `config/`: every section
//! may use it, and it imports none of them.

use anyhow::bail;

/// The longest of the sender's and receiver's retention settings (30 days).
pub(super) const MAX_SECONDS: u64 = 30 * 86_400;

/// The default horizon of every channel: how far ahead an ExpiryTime, a `groupExpiryTime` or
/// a `groupMaxIdleDuration` may reach (D13). Anything further is refused on arrival.
pub(super) const DEFAULT_HORIZON_SECONDS: u64 = 30 * 86_400;

/// The largest horizon an operator may configure (about 10 years): far inside chrono's range,
/// so no arithmetic on an accepted date can overflow.
pub(super) const MAX_HORIZON_SECONDS: u64 = 3_660 * 86_400;

/// A horizon setting (`key` names it in the error): between 1 s and `MAX_HORIZON_SECONDS`.
pub(super) fn horizon(key: &str, seconds: u64) -> anyhow::Result<chrono::Duration> {
    if seconds == 0 || seconds > MAX_HORIZON_SECONDS {
        bail!("{key} must be between 1 and {MAX_HORIZON_SECONDS}");
    }
    Ok(chrono::Duration::seconds(seconds as i64))
}

/// Milliseconds as a chrono duration, clamped so that adding it to a date cannot overflow.
pub(super) fn millis(ms: u64) -> chrono::Duration {
    chrono::Duration::milliseconds(ms.min(i64::MAX as u64 / 2) as i64)
}

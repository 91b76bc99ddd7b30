//! The receiver's settings (DESIGN §4): clock skew, how long delivered IDs are answered for,
//! the group idle default, horizons, the per-source group quota and the ordered buffer,
//! checked into the group `Policy`. Decides nothing about a message; `rmp` applies the policy.

use anyhow::bail;

use super::bounds::{MAX_HORIZON_SECONDS, MAX_SECONDS, horizon};
use super::channels::Horizons;
use super::file::FileConfig;
use crate::rmp::group::Policy;
use crate::rmp::quota::SourceQuota;
use crate::wsr::datetime::XsDuration;

/// The checked receiver settings.
pub(super) struct Receiving {
    pub policy: Policy,
    /// The horizons of every channel that sets none of its own.
    pub horizons: Horizons,
}

impl Receiving {
    pub fn check(f: &FileConfig) -> anyhow::Result<Receiving> {
        let default_idle = XsDuration::parse(&f.default_group_idle)
            .map_err(|e| anyhow::anyhow!("default_group_idle: {e}"))?;
        if default_idle.negative || default_idle.is_zero() {
            bail!("default_group_idle must be positive");
        }
        if f.max_open_groups_per_source == 0 {
            bail!("max_open_groups_per_source must be at least 1");
        }
        let horizons = Horizons {
            expiry: horizon("max_expiry_horizon_seconds", f.max_expiry_horizon_seconds)?,
            group_lifetime: horizon("max_group_lifetime_seconds", f.max_group_lifetime_seconds)?,
            quota: SourceQuota {
                max_stored_bytes: f.max_stored_bytes_per_source,
                max_messages_per_second: f.max_messages_per_second_per_source,
            },
        };
        // The default idle limit is added to every group's last activity: keep it a horizon.
        let epoch = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let longest = epoch + chrono::Duration::seconds(MAX_HORIZON_SECONDS as i64);
        if default_idle.add_to(epoch).is_none_or(|end| end > longest) {
            bail!("default_group_idle must be at most {MAX_HORIZON_SECONDS} seconds");
        }
        let policy = Policy {
            clock_skew: chrono::Duration::seconds(f.clock_skew_seconds.min(86_400) as i64),
            default_idle,
            buffer_max_messages: f.buffer_max_messages,
            buffer_max_bytes: f.buffer_max_bytes,
            max_open_groups_per_source: f.max_open_groups_per_source,
            answer_polls_for: chrono::Duration::seconds(
                f.delivered_id_retention_seconds.min(MAX_SECONDS) as i64,
            ),
        };
        Ok(Receiving { policy, horizons })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn a_source_may_open_a_group_and_polls_are_answered_an_hour() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        // More of its mistakes are in `mistakes_are_refused_not_ignored`.
        std::fs::write(&path, "max_open_groups_per_source = 0").expect("write config");
        assert!(Config::load(Some(&path), []).is_err(), "a quota of nothing");
        let c = Config::load(None, []).expect("defaults");
        assert_eq!(c.policy.answer_polls_for, chrono::Duration::hours(1));
        assert_eq!(c.policy.max_open_groups_per_source, 10_000);
    }
}

//! Storage quotas per source (D13): how many bytes of messages one source (a partner, or an
//! anonymous peer's address) may keep stored — in the inbox until purged, or in an ordered
//! buffer — and how many messages per second it may have stored. A message beyond either is
//! refused with the transient `MessageProcessingFailure`, so that a well-behaved sender resends
//! later, and nothing of it is stored. Pure: the store says how much the source holds, the
//! rate's buckets are kept by the caller, time is passed in.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

/// A source's quota on one channel: the channel's own, else the top level's, narrowed by a
/// partner's own. `0` turns a limit off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceQuota {
    pub max_stored_bytes: u64,
    pub max_messages_per_second: u64,
}

impl SourceQuota {
    /// 1 GiB kept per source, 1 000 messages stored per second: far above what one
    /// partner's traffic needs on one channel, far below what fills a disk in minutes.
    pub const DEFAULT: SourceQuota = SourceQuota {
        max_stored_bytes: 1024 * 1024 * 1024,
        max_messages_per_second: 1000,
    };

    /// No limit at all (tests, and stores asked to decide without a channel).
    pub const UNLIMITED: SourceQuota = SourceQuota {
        max_stored_bytes: 0,
        max_messages_per_second: 0,
    };

    /// This quota with a partner's own limits in place of the channel's where it sets them.
    pub fn overridden(self, max_stored_bytes: Option<u64>, per_second: Option<u64>) -> Self {
        SourceQuota {
            max_stored_bytes: max_stored_bytes.unwrap_or(self.max_stored_bytes),
            max_messages_per_second: per_second.unwrap_or(self.max_messages_per_second),
        }
    }
}

/// Which quota held a message back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HeldBack {
    StoredBytes,
    MessagesPerSecond,
}

impl HeldBack {
    /// The metric label and the console's word.
    pub fn as_str(self) -> &'static str {
        match self {
            HeldBack::StoredBytes => "stored_bytes",
            HeldBack::MessagesPerSecond => "messages_per_second",
        }
    }
}

/// How much room a message's source has left, as the store sees it when deciding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRoom {
    pub quota: SourceQuota,
    /// Bytes the source's messages take in the store now (this batch's included).
    pub stored_bytes: u64,
    /// Whether its rate has a message to spare now.
    pub rate_allows: bool,
}

impl SourceRoom {
    /// Room for anything: the quota is off.
    pub const UNLIMITED: SourceRoom = SourceRoom {
        quota: SourceQuota::UNLIMITED,
        stored_bytes: 0,
        rate_allows: true,
    };

    /// Why a message of `body_bytes` may not be stored, and the reason its sender reads.
    /// One message on its own always fits an empty quota, so that a quota smaller than a
    /// message still lets the source send, one at a time.
    pub fn refusal(&self, body_bytes: u64) -> Option<(HeldBack, String)> {
        let max = self.quota.max_stored_bytes;
        if max > 0 && self.stored_bytes > 0 && self.stored_bytes.saturating_add(body_bytes) > max {
            return Some((
                HeldBack::StoredBytes,
                format!(
                    "this source's stored messages take {} of its {max} bytes; resend once \
                     they have been consumed",
                    self.stored_bytes
                ),
            ));
        }
        if !self.rate_allows {
            return Some((
                HeldBack::MessagesPerSecond,
                format!(
                    "this source sends more than {} messages per second; resend later",
                    self.quota.max_messages_per_second
                ),
            ));
        }
        None
    }
}

/// Most sources whose rates are remembered; beyond it, the ones with a full bucket (idle for
/// at least a second) are forgotten, which changes nothing for them.
const MAX_TRACKED_SOURCES: usize = 10_000;

/// Token buckets of message rates per source: each holds at most one second's worth, and
/// refills at the source's rate.
#[derive(Debug, Default)]
pub struct SourceRates {
    buckets: HashMap<String, Bucket>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: DateTime<Utc>,
}

impl Bucket {
    fn refilled(self, per_second: u64, now: DateTime<Utc>) -> f64 {
        let elapsed = (now - self.at)
            .num_microseconds()
            .unwrap_or(i64::MAX)
            .max(0) as f64;
        let cap = per_second as f64;
        (self.tokens + elapsed / 1e6 * cap).min(cap)
    }
}

impl SourceRates {
    /// Whether `source` may have one more message stored at `now`, besides `pending` ones
    /// decided but not yet counted (`take`n).
    pub fn allows(&self, source: &str, per_second: u64, now: DateTime<Utc>, pending: u64) -> bool {
        if per_second == 0 {
            return true;
        }
        let tokens = self
            .buckets
            .get(source)
            .map_or(per_second as f64, |b| b.refilled(per_second, now));
        tokens >= pending as f64 + 1.0
    }

    /// Counts `n` messages of `source` stored at `now`.
    pub fn take(&mut self, source: &str, per_second: u64, now: DateTime<Utc>, n: u64) {
        if per_second == 0 || n == 0 {
            return;
        }
        if self.buckets.len() >= MAX_TRACKED_SOURCES && !self.buckets.contains_key(source) {
            let cap = per_second as f64;
            self.buckets
                .retain(|_, b| b.refilled(per_second, now) < cap);
        }
        let tokens = match self.buckets.get(source) {
            Some(b) => b.refilled(per_second, now),
            None => per_second as f64,
        };
        self.buckets.insert(
            source.to_owned(),
            Bucket {
                tokens: (tokens - n as f64).max(0.0),
                at: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("time")
    }

    fn room(max_stored_bytes: u64, stored_bytes: u64) -> SourceRoom {
        SourceRoom {
            quota: SourceQuota {
                max_stored_bytes,
                max_messages_per_second: 0,
            },
            stored_bytes,
            rate_allows: true,
        }
    }

    #[test]
    fn stored_bytes_hold_a_source_back_once_the_next_message_would_not_fit() {
        assert_eq!(room(1000, 0).refusal(400), None);
        assert_eq!(room(1000, 600).refusal(400), None, "exactly full");
        let (held, why) = room(1000, 601).refusal(400).expect("over");
        assert_eq!(held, HeldBack::StoredBytes);
        assert!(why.contains("601 of its 1000 bytes"), "{why}");
        assert_eq!(room(0, u64::MAX).refusal(u64::MAX), None, "0 turns it off");
    }

    #[test]
    fn a_message_bigger_than_the_quota_still_goes_alone() {
        assert_eq!(room(1000, 0).refusal(5000), None);
        assert!(room(1000, 1).refusal(5000).is_some());
    }

    #[test]
    fn a_partners_own_limits_replace_the_channels() {
        let channel = SourceQuota {
            max_stored_bytes: 10,
            max_messages_per_second: 5,
        };
        assert_eq!(channel.overridden(None, None), channel);
        assert_eq!(
            channel.overridden(Some(0), Some(7)),
            SourceQuota {
                max_stored_bytes: 0,
                max_messages_per_second: 7
            }
        );
    }

    #[test]
    fn a_rate_allows_a_seconds_burst_then_refills_at_its_pace() {
        let mut rates = SourceRates::default();
        let t = t0();
        for _ in 0..3 {
            assert!(rates.allows("a", 3, t, 0));
            rates.take("a", 3, t, 1);
        }
        assert!(!rates.allows("a", 3, t, 0), "the burst is spent");
        assert!(rates.allows("b", 3, t, 0), "another source has its own");
        assert!(
            rates.allows("b", 3, t, 2) && !rates.allows("b", 3, t, 3),
            "pending count"
        );
        let later = t + chrono::Duration::milliseconds(340);
        assert!(
            rates.allows("a", 3, later, 0),
            "a third of a second refills one"
        );
        rates.take("a", 3, later, 1);
        assert!(!rates.allows("a", 3, later, 0));
        assert!(rates.allows("a", 0, later, 99), "0 turns it off");
    }

    #[test]
    fn idle_sources_are_forgotten_when_too_many_are_tracked() {
        let mut rates = SourceRates::default();
        let t = t0();
        for i in 0..MAX_TRACKED_SOURCES {
            rates.take(&format!("s{i}"), 10, t, 1);
        }
        rates.take("busy", 10, t + chrono::Duration::seconds(2), 1);
        assert_eq!(rates.buckets.len(), 1, "only the new source is left");
    }

    #[test]
    fn a_clock_that_goes_back_refills_nothing() {
        let mut rates = SourceRates::default();
        let t = t0();
        rates.take("a", 1, t, 1);
        assert!(!rates.allows("a", 1, t - chrono::Duration::seconds(5), 0));
    }
}
